#!/bin/bash
# bash without verbs: pipelines, subshells, command substitution, background jobs and
# wait, traps (EXIT, a signal sent to itself, ERR), large variables (bash's own malloc
# grows and frees them: mmapped chunks, realloc, heap trimming). Prints only what the work
# determines; exits 5.
set -u
trap 'echo "exit trap, status $?"' EXIT
trap 'echo "got USR1"' USR1
trap 'echo "err trap at $LINENO"' ERR

# Pipelines and command substitution.
echo "pipeline: $(seq 1 5000 | awk '{ s += $1 } END { print s }')"
echo "sorted: $(printf '%s\n' pear apple fig banana | sort | tr '\n' ' ')"
count=$(seq 1 2000 | grep -c 7)
echo "sevens: $count"

# Subshells: changes stay inside, exit statuses come out.
x=outer
( x=inner; echo "subshell sees $x"; exit 3 )
echo "subshell status $?, x=$x"
echo "nested: $( ( echo a; ( echo b; ( echo c ) ) ) | tr -d '\n')"

# Large variables: grown by appending, copied, cut, freed.
big=""
for i in $(seq 1 2000); do
  big+="line $i of a large variable that bash's malloc keeps growing;"
done
echo "big: ${#big}"
copy=$big$big$big
echo "copy: ${#copy} $(printf '%s' "$copy" | md5sum | cut -c1-16)"
unset copy
arr=()
for i in $(seq 1 20000); do arr+=("$i"); done
echo "array: ${#arr[@]} ${arr[19999]} sum $(IFS=+; echo $(( ${arr[*]} )))"
unset arr
huge=$(head -c 4000000 /dev/zero | tr '\0' 'z')
echo "huge: ${#huge}"
huge=${huge:0:10}
echo "cut: $huge"

# Background jobs and wait: each exits with its own status.
for i in 1 2 3 4; do
  ( sleep 0.0$i; seq 1 $((i * 1000)) | md5sum | cut -c1-8 > "$JOBS_DIR/job$i"; exit $i ) &
  pids[$i]=$!
done
for i in 1 2 3 4; do
  wait "${pids[$i]}"
  echo "job $i status $? $(cat "$JOBS_DIR/job$i")"
done
{ echo piped-job | tr a-z A-Z; } &
wait $!
echo "wait status $?"

# A signal to ourselves, handled by the trap; an ERR trap.
kill -USR1 $$
false
# A pipeline's statuses.
true | false | true
echo "pipestatus ${PIPESTATUS[*]}"
exit 5

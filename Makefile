# Build and install the launcher and the library where the launcher finds them:
#   make install PREFIX=/opt/mrcache   ->  $(PREFIX)/bin/mrcache, $(PREFIX)/lib/libmrcache.so,
#   the manual pages (share/man/man1, man7) and the bash/zsh/fish completions, written
#   from the code by `mrcache __generate` (cli/src/generate.rs), and the environment module
#   file share/modulefiles/mrcache/VERSION (dist/modulefile.tcl.in; docs/usage.md).
PREFIX ?= /usr/local
CARGO ?= cargo

.PHONY: build install uninstall test demo check-prefix
export PREFIX DESTDIR

build:
	$(CARGO) build --release --workspace

GEN = target/generated
# Where cargo puts the release build (CARGO_TARGET_DIR, build.target-dir, else target/).
RELEASE = $(shell $(CARGO) metadata --format-version 1 --no-deps --offline | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release
SHARE = $(DESTDIR)$(PREFIX)/share
VERSION = $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

# The recipes, the module file's Tcl string and the sed that fills it in take the paths as
# they are: a PREFIX or DESTDIR with a space, quote, `[`, `&`, `$`... is refused, in one line.
check-prefix:
	@case "$$DESTDIR$$PREFIX" in ""|*[!A-Za-z0-9/._+,:@~-]*) \
	  echo "make install: PREFIX='$$PREFIX' DESTDIR='$$DESTDIR' refused: only letters, digits and / . _ + , : @ ~ - are allowed (no spaces, quotes, [ ] { } & \$$ ; \\)" >&2; exit 1;; esac

install: check-prefix build
	rm -rf $(GEN) && $(RELEASE)/mrcache __generate $(GEN)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(SHARE)/man/man1 $(SHARE)/man/man7 \
	  $(SHARE)/bash-completion/completions $(SHARE)/zsh/site-functions $(SHARE)/fish/vendor_completions.d
	install -m 755 $(RELEASE)/mrcache $(DESTDIR)$(PREFIX)/bin/mrcache
	install -m 755 $(RELEASE)/libmrcache.so $(DESTDIR)$(PREFIX)/lib/libmrcache.so
	install -m 755 $(RELEASE)/libmrcache_engine.so $(DESTDIR)$(PREFIX)/lib/libmrcache_engine.so
	install -m 644 $(GEN)/man1/*.1 $(SHARE)/man/man1/
	install -m 644 $(GEN)/man7/*.7 $(SHARE)/man/man7/
	install -m 644 $(GEN)/completions/mrcache.bash $(SHARE)/bash-completion/completions/mrcache
	install -m 644 $(GEN)/completions/_mrcache $(SHARE)/zsh/site-functions/_mrcache
	install -m 644 $(GEN)/completions/mrcache.fish $(SHARE)/fish/vendor_completions.d/mrcache.fish
	install -d $(SHARE)/modulefiles/mrcache
	sed -e 's|@VERSION@|$(VERSION)|g' -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(PREFIX)/lib|g' \
	  dist/modulefile.tcl.in > $(SHARE)/modulefiles/mrcache/$(VERSION)

uninstall: check-prefix
	rm -f $(DESTDIR)$(PREFIX)/bin/mrcache $(DESTDIR)$(PREFIX)/lib/libmrcache.so \
	  $(DESTDIR)$(PREFIX)/lib/libmrcache_engine.so
	rm -f $(SHARE)/man/man1/mrcache.1 $(SHARE)/man/man1/mrcache-*.1 $(SHARE)/man/man7/mrcache-config.7
	rm -f $(SHARE)/bash-completion/completions/mrcache $(SHARE)/zsh/site-functions/_mrcache \
	  $(SHARE)/fish/vendor_completions.d/mrcache.fish
	rm -rf $(SHARE)/modulefiles/mrcache

test:
	./ci/test

demo:
	./ci/demo

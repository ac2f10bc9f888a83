fn main() {
    front();
    static_unwinder();
}

/// Build libmrcache.so, the front (`front/lib.rs`): a `no_std` cdylib with `panic=abort`,
/// which a workspace built with `panic=unwind` cannot hold as a crate, so it is compiled
/// here with the same rustc, for the same target, and put beside libmrcache_engine.so in the
/// target's profile directory. Its verbs entry points are exported under libibverbs' own
/// symbol versions, so that a reference to an older ABI (ibv_reg_mr@IBVERBS_1.0) never binds
/// to the modern hook; aarch64's oldest glibc symbol version is GLIBC_2.17 (x86-64's
/// GLIBC_2.2.5).
fn front() {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let dir = std::path::PathBuf::from(var("CARGO_MANIFEST_DIR"));
    let map = dir.join(match var("CARGO_CFG_TARGET_ARCH").as_str() {
        "aarch64" => "libmrcache-aarch64.map",
        _ => "libmrcache.map",
    });
    let src = dir.join("front/lib.rs");
    for f in [
        map.clone(),
        src.clone(),
        dir.join("src/sys/front_abi.rs"),
        dir.join("src/sys/link_map.rs"),
    ] {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let out = std::path::PathBuf::from(var("OUT_DIR"));
    let lib = out.join("libmrcache.so");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let mut cmd = std::process::Command::new(rustc);
    cmd.args([
        "--edition",
        "2024",
        "--crate-type",
        "cdylib",
        "--crate-name",
        "mrcache",
    ])
    .args(["--target", &var("TARGET")])
    .args([
        "-C",
        "panic=abort",
        "-C",
        "opt-level=2",
        "-C",
        "debuginfo=1",
    ])
    .args(["-D", "warnings"])
    .arg("-C")
    .arg(format!("link-arg=-Wl,--version-script={}", map.display()))
    .args(["-C", "link-arg=-Wl,--no-as-needed,-lc"])
    .env("MRCACHE_VERSION", var("CARGO_PKG_VERSION"))
    .arg("-o")
    .arg(&lib)
    .arg(&src);
    if let Ok(linker) = std::env::var("RUSTC_LINKER") {
        cmd.arg("-C").arg(format!("linker={linker}"));
    }
    // The build's own flags (a cross build's linker arguments), as cargo passes them.
    for flag in var("CARGO_ENCODED_RUSTFLAGS")
        .split('\x1f')
        .filter(|f| !f.is_empty())
    {
        cmd.arg(flag);
    }
    let done = cmd
        .output()
        .expect("preload/build.rs: cannot run rustc for the front");
    if !done.status.success() {
        panic!(
            "preload/build.rs: the front (front/lib.rs) did not build:\n{}",
            String::from_utf8_lossy(&done.stderr)
        );
    }
    // OUT_DIR is <target dir>/[<triple>/]<profile>/build/<package>-<hash>/out: the front
    // goes three levels up, beside the engine cargo builds.
    let profile_dir = out
        .ancestors()
        .nth(3)
        .expect("OUT_DIR has no profile directory");
    let dest = profile_dir.join("libmrcache.so");
    // A fresh file (never written in place: a running test may have it mapped).
    let tmp = profile_dir.join(".libmrcache.so.new");
    std::fs::copy(&lib, &tmp).expect("preload/build.rs: cannot copy the front");
    std::fs::rename(&tmp, &dest).expect("preload/build.rs: cannot place the front");
}

/// Link the unwinder statically: a preloaded libgcc_s.so.1 costs a process that never uses
/// verbs about 0.1 ms of start-up (its lookup, mapping, relocation and a constructor whose
/// `cpuid` traps to the hypervisor in a VM), nearly half of what libmrcache.so costs. std
/// names `-lgcc_s`; a `libgcc_s.a` made from the compiler's `libgcc_eh.a`, found first on the
/// search path, satisfies it with the same unwinder, and the version script keeps its symbols
/// local.
///
/// The copy calls glibc's `__libc_malloc`/`__libc_free` (and calloc, realloc) instead of
/// `malloc`/`free`: its C code calls them through the PLT, and a patcher that rewrites every
/// object's PLT slots for the allocator (UCX's memory hooks in reloc mode) then took over the
/// library's allocator calls half-way, and glibc was handed UCX's blocks ("munmap_chunk():
/// invalid pointer", tests/host/coexist_with_other_hooks.rs). The unwinder allocates only where frames are
/// registered by hand, which nothing in the library does.
///
/// Where the compiler has no `libgcc_eh.a` or no objcopy is found, the library links against
/// libgcc_s.so.1 as before (with a build warning).
fn static_unwinder() {
    let target = std::env::var("TARGET").unwrap_or_default();
    let under = target.replace('-', "_");
    let cc = std::env::var(format!("CC_{under}"))
        .or_else(|_| std::env::var(format!("CARGO_TARGET_{}_LINKER", under.to_uppercase())))
        .unwrap_or_else(|_| "cc".to_string());
    println!("cargo:rerun-if-env-changed=CC_{under}");
    println!(
        "cargo:rerun-if-env-changed=CARGO_TARGET_{}_LINKER",
        under.to_uppercase()
    );
    let found = std::process::Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let Some(eh) = found.filter(|p| p.starts_with('/') && std::path::Path::new(p).is_file()) else {
        println!("cargo:warning=no libgcc_eh.a from {cc}: libmrcache.so needs libgcc_s.so.1");
        return;
    };
    // The target's binutils, as the compiler finds them (a cross compiler's own objcopy).
    let tool = |name: &str| {
        std::process::Command::new(&cc)
            .arg(format!("-print-prog-name={name}"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| name.to_string())
    };
    let (objcopy, nm) = (tool("objcopy"), tool("nm"));
    println!("cargo:rerun-if-changed={eh}");
    let dir = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("unwind");
    let archive = dir.join("libgcc_s.a");
    let _ = std::fs::remove_dir_all(&dir);
    // An objcopy that does not know the target's format may still exit 0 (saying so on
    // stderr): the rewrite counts only if it was silent and nm then finds no reference to
    // the allocator left.
    let rewritten = std::fs::create_dir_all(&dir).is_ok()
        && std::fs::copy(&eh, &archive).is_ok()
        && std::process::Command::new(&objcopy)
            .args(["--redefine-sym", "malloc=__libc_malloc"])
            .args(["--redefine-sym", "free=__libc_free"])
            .args(["--redefine-sym", "calloc=__libc_calloc"])
            .args(["--redefine-sym", "realloc=__libc_realloc"])
            .arg(&archive)
            .output()
            .is_ok_and(|o| o.status.success() && o.stderr.is_empty())
        && std::process::Command::new(&nm)
            .args(["-u", "--format=just-symbols"])
            .arg(&archive)
            .output()
            .is_ok_and(|o| {
                o.status.success()
                    && !String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .any(|l| ["malloc", "free", "calloc", "realloc"].contains(&l.trim()))
            });
    if !rewritten {
        let _ = std::fs::remove_dir_all(&dir);
        println!(
            "cargo:warning={objcopy} could not rewrite {eh}: libmrcache.so needs libgcc_s.so.1"
        );
        return;
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
}

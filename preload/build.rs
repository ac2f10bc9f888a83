fn main() {
    // Export the verbs hooks under libibverbs' own symbol versions, so that a reference to
    // an older ABI (ibv_reg_mr@IBVERBS_1.0) never binds to the modern hook.
    // aarch64's oldest glibc symbol version is GLIBC_2.17 (x86-64's GLIBC_2.2.5).
    let name = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => "libmrcache-aarch64.map",
        _ => "libmrcache.map",
    };
    let map = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join(name);
    println!("cargo:rerun-if-changed={}", map.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    static_unwinder();
}

/// Link the unwinder statically: a preloaded libgcc_s.so.1 costs a process that never uses
/// verbs about 150 us of start-up (its lookup, mapping, relocation and constructor), more than
/// the rest of libmrcache.so. std names `-lgcc_s`; a `libgcc_s.a` that is the compiler's
/// `libgcc_eh.a`, found first on the search path, satisfies it with the same unwinder, and the
/// version script keeps its symbols local. Where the compiler has no `libgcc_eh.a` the library
/// links against libgcc_s.so.1 as before.
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
    let dir = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("unwind");
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libgcc_s.a");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&eh, &link).unwrap();
    println!("cargo:rustc-link-search=native={}", dir.display());
}

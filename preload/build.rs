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
}

fn main() {
    // Export the verbs hooks under libibverbs' own symbol versions, so that a reference to
    // an older ABI (ibv_reg_mr@IBVERBS_1.0) never binds to the modern hook.
    let map =
        std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("libmrcache.map");
    println!("cargo:rerun-if-changed={}", map.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}

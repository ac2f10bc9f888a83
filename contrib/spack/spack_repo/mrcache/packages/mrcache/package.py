# Spack package for mrcache (contrib/README.md), in a package repository of the v2 layout
# (Spack 1.0 and later): `spack repo add contrib/spack/spack_repo/mrcache`.

import os

from spack_repo.builtin.build_systems.cargo import CargoPackage

from spack.package import *


class Mrcache(CargoPackage):
    """A transparent memory-registration cache for RDMA verbs programs: libmrcache.so, loaded
    with LD_PRELOAD, caches ibv_reg_mr registrations and drops each one before its memory is
    unmapped, for unmodified MPI, libfabric, UCX and plain verbs programs. The mrcache
    launcher runs a program with it (mrcache run -- PROGRAM) and says what it would do here
    (mrcache info)."""

    # mrcache has no published home yet: a site that publishes the release tarball (made
    # with `git archive --prefix=mrcache-VERSION/ vVERSION`) sets homepage, url and the
    # version's sha256. From a checkout: `spack develop --path . mrcache@0.1.0`.
    homepage = "https://example.invalid/mrcache"
    url = "https://example.invalid/mrcache/mrcache-0.1.0.tar.gz"

    license("MIT OR Apache-2.0")

    version("0.1.0")

    # Edition 2024; Rust 1.90 and later link with rust-lld, which the library's symbol
    # versions need (below).
    depends_on("rust@1.90:", type="build")
    depends_on("c", type="build")  # cargo links through the C compiler
    # libmrcache.so is not linked against libibverbs: it uses the program's own at run time.
    # rdma-core is best an external (packages.yaml: the system's, matching its kernel
    # drivers and provider plugins).
    depends_on("rdma-core", type="run")

    sanity_check_is_file = [
        join_path("bin", "mrcache"),
        join_path("lib", "libmrcache.so"),
        join_path("share", "man", "man1", "mrcache.1"),
        join_path("share", "man", "man7", "mrcache-config.7"),
    ]

    @property
    def build_directory(self):
        # The launcher is the workspace's cli/ package: `cargo install --path .` runs there.
        return join_path(self.stage.source_path, "cli")

    def setup_build_environment(self, env):
        # One target directory for the build, the install and the library copied below.
        env.set("CARGO_TARGET_DIR", join_path(self.stage.source_path, "target"))
        # libmrcache.so's symbol versions link with LLD only (GNU ld refuses rustc's
        # anonymous version script beside them): ask for rust-lld by name, whatever linker
        # the compiler wrapper would pick.
        rustc = Executable(self.spec["rust"].prefix.bin.rustc)
        sysroot = rustc("--print", "sysroot", output=str).strip()
        triple = f"{self.spec.target.family}-unknown-linux-gnu"
        gcc_ld = join_path(sysroot, "lib", "rustlib", triple, "bin", "gcc-ld")
        env.append_flags("RUSTFLAGS", f"-C link-arg=-fuse-ld=lld -C link-arg=-B{gcc_ld}")

    def setup_run_environment(self, env):
        # The launcher finds the library through MRCACHE_LIB, and a program is preloaded
        # through any launcher with LD_PRELOAD=$MRCACHE_LIB. The package never sets
        # LD_PRELOAD itself: that would preload the cache into every program started.
        env.set("MRCACHE_LIB", join_path(self.prefix.lib, "libmrcache.so"))

    @run_after("build")
    def build_preload_library(self):
        # `cargo install` (the build phase) builds the launcher only.
        with working_dir(self.stage.source_path):
            cargo = Executable(self.spec["rust"].prefix.bin.cargo)
            cargo("build", "--release", "--locked", "--package", "mrcache-preload")

    @run_after("install")
    def install_library_and_pages(self):
        # `cargo install` installs binaries only: the preload library, the manual pages and
        # the shell completions (written by the launcher) are installed here.
        mkdirp(self.prefix.lib)
        for lib in ("libmrcache.so", "libmrcache_engine.so"):
            install(join_path(self.stage.source_path, "target", "release", lib), self.prefix.lib)
        gen = join_path(self.stage.path, "generated")
        Executable(self.prefix.bin.mrcache)("__generate", gen)
        share = self.prefix.share
        install_tree(join_path(gen, "man1"), share.man.man1)
        install_tree(join_path(gen, "man7"), share.man.man7)
        mkdirp(bash_completion_path(self.prefix))
        install(join_path(gen, "completions", "mrcache.bash"), bash_completion_path(self.prefix) / "mrcache")
        mkdirp(zsh_completion_path(self.prefix))
        install(join_path(gen, "completions", "_mrcache"), zsh_completion_path(self.prefix) / "_mrcache")
        mkdirp(fish_completion_path(self.prefix))
        install(
            join_path(gen, "completions", "mrcache.fish"),
            fish_completion_path(self.prefix) / "mrcache.fish",
        )

    @run_after("install")
    def check_info(self):
        # What the library would do here: exits non-zero when the launcher cannot find or
        # load the installed library.
        env = dict(os.environ, MRCACHE_LIB=join_path(self.prefix.lib, "libmrcache.so"))
        Executable(self.prefix.bin.mrcache)("info", output=os.devnull, env=env)

    def test_info(self):
        """mrcache info finds the installed library and runs its self-test"""
        mrcache = which(self.prefix.bin.mrcache, required=True)
        out = mrcache("info", output=str, error=str)
        assert f"library: {join_path(self.prefix.lib, 'libmrcache.so')}" in out

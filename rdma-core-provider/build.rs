// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
//! Generates the rdma-core bindings and links against the pinned rdma-core's libibverbs.
//!
//! Inputs (environment):
//! - `RDMA_CORE_SRC`: a prepared rdma-core tree. Unset: run `prepare-rdma-core.sh`, which
//!   prepares (first time) and names the tree in the metaroce cache,
//!   `${METAROCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metaroce}/rdma-core-56.1`.
//! - `RDMA_CORE_BUILD`: its cmake build directory (default `$RDMA_CORE_SRC/build`).
//! - `BINDGEN`: the bindgen CLI (default `bindgen` from `PATH`, then `~/.cargo/bin/bindgen`).
//! - `LIBCLANG_PATH`: passed through to bindgen (default `/usr/lib/llvm-22/lib` if present).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Must match RDMA_CORE_VERSION in qemu-ci/common.sh.
const RDMA_CORE_VERSION: &str = "56.1";
/// SONAME of the library (installed as `$LIBDIR/libmetaroce.so.1`; the plugin name
/// `libibverbs/libmetaroce-rdmav34.so`, with the IBVERBS_PRIVATE ABI 34, is a symlink to it).
const SONAME: &str = "libmetaroce.so.1";

fn main() {
    for var in [
        "RDMA_CORE_SRC",
        "RDMA_CORE_BUILD",
        "BINDGEN",
        "LIBCLANG_PATH",
        "METAROCE_CACHE",
        "XDG_CACHE_HOME",
        "HOME",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap());
    let uapi = manifest.join("../uapi");
    let wrapper = manifest.join("src/wrapper.h");
    let version_script = manifest.join("libmetaroce.map");
    for input in [
        wrapper.clone(),
        uapi.join("metaroce-abi.h"),
        manifest.join("metaroce_dv.h"),
        version_script.clone(),
    ] {
        println!("cargo:rerun-if-changed={}", input.display());
    }

    let (src, build) = rdma_core_tree(&manifest);
    let include = build.join("include");
    let libdir = build.join("lib");
    let driver_h = include.join("infiniband/driver.h");
    if !driver_h.exists() || !include.join("kernel-abi/ib_user_verbs.h").exists() {
        fail(&format!(
            "{} has no generated kern-abi headers: not a prepared rdma-core tree",
            build.display()
        ));
    }
    println!("cargo:rerun-if-changed={}", src.join(".done").display());

    bindgen(
        &wrapper,
        &include,
        &uapi,
        &manifest,
        &out.join("bindings.rs"),
    );

    // Link against the pinned libibverbs (IBVERBS_PRIVATE_34), never the host's. Copies in
    // OUT_DIR: cargo puts link directories inside the target dir on the library path of
    // `cargo test`, so the unit tests load this libibverbs rather than the host's older one.
    let linkdir = out.join("lib");
    fs::create_dir_all(&linkdir).unwrap();
    let mut found = false;
    for entry in
        fs::read_dir(&libdir).unwrap_or_else(|e| fail(&format!("{}: {e}", libdir.display())))
    {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("libibverbs.so") {
            let real = fs::canonicalize(entry.path()).unwrap();
            let dst = linkdir.join(&*name);
            let _ = fs::remove_file(&dst);
            fs::copy(&real, &dst).unwrap();
            found |= name == "libibverbs.so";
        }
    }
    if !found {
        fail(&format!("{} has no libibverbs.so", libdir.display()));
    }
    println!("cargo:rustc-link-search=native={}", linkdir.display());
    println!("cargo:rustc-link-lib=dylib=ibverbs");
    // Refuse undefined symbols: without it a missing libibverbs links silently and the plugin
    // would lack the versioned IBVERBS_PRIVATE_34 references.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
    // One library for both roles, as rdma-core's mlx5: applications link libmetaroce.so.1 for
    // the direct verbs, and libibverbs dlopens it as libibverbs/libmetaroce-rdmav34.so, a
    // symlink to it (the same file, so the constructor runs once).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{SONAME}");
    // Defines the version node METAROCE_1.0 that `.symver` in src/ffi/dv.rs gives the direct
    // verbs. rustc passes its own anonymous version script (exported = the #[no_mangle]
    // functions, all else local); lld takes both, GNU ld refuses to combine them.
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        version_script.display()
    );
    println!("cargo:rustc-env=METAROCE_RDMA_CORE_VERSION={RDMA_CORE_VERSION}");
}

fn fail(msg: &str) -> ! {
    panic!(
        "\n\nmetaroce-provider: {msg}\n\
         The build needs rdma-core {RDMA_CORE_VERSION} prepared by \
         rdma-core-provider/prepare-rdma-core.sh\n\
         (RDMA_CORE_SRC unset: build.rs runs it) and the tools of qemu-ci/setup-host.sh.\n\n"
    )
}

fn rdma_core_tree(manifest: &Path) -> (PathBuf, PathBuf) {
    let src = match env::var_os("RDMA_CORE_SRC") {
        Some(s) => PathBuf::from(s),
        // Instant once the cache holds the tree; on a fresh machine it downloads and builds
        // rdma-core (about half a minute), so plain `cargo build/test` work from a clean clone.
        None => {
            let script = manifest.join("prepare-rdma-core.sh");
            println!("cargo:rerun-if-changed={}", script.display());
            let out = Command::new(&script)
                .stderr(Stdio::inherit())
                .output()
                .unwrap_or_else(|e| fail(&format!("running {}: {e}", script.display())));
            if !out.status.success() {
                fail(&format!("{} failed ({})", script.display(), out.status));
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    let build = env::var_os("RDMA_CORE_BUILD")
        .map(PathBuf::from)
        .unwrap_or_else(|| src.join("build"));
    (src, build)
}

fn bindgen_cli() -> PathBuf {
    if let Some(b) = env::var_os("BINDGEN") {
        return PathBuf::from(b);
    }
    let on_path = env::var_os("PATH")
        .map(|p| {
            env::split_paths(&p)
                .map(|d| d.join("bindgen"))
                .find(|b| b.is_file())
        })
        .unwrap_or(None);
    on_path
        .or_else(|| {
            env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".cargo/bin/bindgen"))
                .filter(|b| b.is_file())
        })
        .unwrap_or_else(|| {
            fail("bindgen CLI not found (qemu-ci/setup-host.sh installs it); set BINDGEN")
        })
}

fn bindgen(wrapper: &Path, include: &Path, uapi: &Path, manifest: &Path, output: &Path) {
    let mut cmd = Command::new(bindgen_cli());
    if env::var_os("LIBCLANG_PATH").is_none() && Path::new("/usr/lib/llvm-22/lib").is_dir() {
        cmd.env("LIBCLANG_PATH", "/usr/lib/llvm-22/lib");
    }
    cmd.arg(wrapper).arg("-o").arg(output);
    cmd.args(["--rust-edition", "2021", "--no-doc-comments"]);
    cmd.args(["--default-enum-style", "consts"]);
    // Only what the provider uses; everything it references comes along.
    cmd.args([
        "--allowlist-function",
        "verbs_register_driver_[0-9]+|_verbs_init_and_alloc_context|verbs_uninit_context|\
         verbs_set_ops|ibv_cmd_get_context|ibv_cmd_query_device_any|ibv_cmd_query_port|\
         ibv_cmd_(alloc|dealloc)_(pd|mw)|ibv_cmd_(reg|rereg|dereg)_mr|ibv_cmd_(create|destroy|resize)_cq|\
         ibv_cmd_req_notify_cq|ibv_cmd_(create|query|modify|destroy)_qp|\
         ibv_cmd_(create|query|modify|destroy)_srq|ibv_cmd_modify_qp_ex|ibv_cmd_create_cq_ex|\
         ibv_cmd_create_qp_ex|ibv_cmd_(attach|detach)_mcast|metaroce_dv_.*|\
         calloc|free|__errno_location|mmap|munmap|write",
    ]);
    cmd.args([
        "--allowlist-type",
        "verbs_device_ops|verbs_device|verbs_sysfs_dev|verbs_context|verbs_context_ops|\
         verbs_match_ent|metaroce_.*|ibv_get_context|ib_uverbs_get_context_resp|ibv_alloc_mw|ib_uverbs_alloc_mw_resp|ibv_mw_type|ibv_mw_bind|ibv_access_flags|ibv_query_port|\
         ib_uverbs_ex_query_device_resp|ibv_device_attr_ex|ibv_alloc_pd|ib_uverbs_alloc_pd_resp|\
         ibv_(re)?reg_mr|ib_uverbs_(re)?reg_mr_resp|verbs_mr|verbs_cq|verbs_qp|verbs_srq|ibv_(create|resize)_cq|\
         ibv_create_qp|ibv_query_qp|ibv_modify_qp|ibv_create_srq|ibv_modify_srq|ibv_query_srq|\
         ib_uverbs_post_send|ib_uverbs_post_send_resp|ib_uverbs_cmd_hdr|ib_uverbs_write_cmds|\
         ibv_wc|ibv_send_wr|ibv_recv_wr|ibv_send_flags|ibv_wc_flags|ibv_wc_status|ibv_wc_opcode|\
         ibv_wr_opcode|ibv_qp_type|ibv_srq_attr_mask|ibv_modify_qp_ex|ib_uverbs_ex_modify_qp_resp|\
         ibv_cq_init_attr_ex|ibv_create_cq_ex|ib_uverbs_ex_create_cq_resp|ibv_cq_init_attr_mask|\
         ibv_create_cq_attr_flags|ibv_create_cq_wc_flags|ibv_poll_cq_attr|ibv_qp_init_attr_ex|\
         ibv_qp_init_attr_mask|ibv_qp_attr_mask|ibv_qp_create_send_ops_flags|ibv_data_buf|verbs_qp_mask",
    ]);
    cmd.args([
        "--allowlist-var",
        "METAROCE_.*|VERBS_MATCH_.*|IBVERBS_PABI_VERSION|EPROTO|EIO|EINVAL|ENOMEM|EOPNOTSUPP|ENOENT|\
         IBV_WC_STANDARD_FLAGS|IBV_CREATE_CQ_SUP_WC_FLAGS|\
         PROT_READ|PROT_WRITE|MAP_SHARED",
    ]);
    cmd.arg("--");
    cmd.arg(format!("-I{}", include.display()));
    cmd.arg(format!("-I{}", uapi.display()));
    cmd.arg(format!("-I{}", manifest.display()));
    cmd.arg("-Wno-gnu-variable-sized-type-not-at-end");
    let status = cmd
        .status()
        .unwrap_or_else(|e| fail(&format!("running bindgen: {e}")));
    if !status.success() {
        fail(&format!("bindgen failed ({status})"));
    }
}

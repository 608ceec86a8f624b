//! Gives this crate's tests, examples and doc tests an rpath to the shared libccq that
//! ccq-sys linked (`DEP_CCQ_RPATH`, set only when it linked a shared library).

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_CCQ_RPATH");
    if let Ok(dirs) = std::env::var("DEP_CCQ_RPATH") {
        for d in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{d}");
        }
    }
}

//! Finds (or builds) libccq and generates the layout check of the bindings.
//!
//! Where the library comes from, in this order:
//! 1. `CCQ_LIB_DIR` (a directory with `libccq.so` or `libccq.a`) and `CCQ_INCLUDE_DIR` (with
//!    `ccq.h`; default: this repository's `include/` if it exists, else `$CCQ_LIB_DIR/../include`).
//!    Linked as a shared library unless `CCQ_STATIC=1`. Relative paths are made absolute here
//!    (against `PWD`, where cargo was run, else the workspace), so rpaths never are relative.
//! 2. `pkg-config --libs --cflags ccq` (an installed ccq, `ccq.pc`), shared.
//! 3. This repository's CMake project, built into `OUT_DIR` (`ccq_static`), linked statically
//!    with what its `ccq.pc` says it needs (ck, pthread, m, and CUDA + NCCL, MPI and UCX when
//!    CMake found them; `CCQ_WITH_NCCL`/`CCQ_WITH_MPI`/`CCQ_WITH_UCX` = `OFF` leave them out).
//!
//! Shared linking adds an rpath to this package's own test binaries, and passes the directory
//! on as `DEP_CCQ_RPATH` so that the `ccq` crate's build script does the same for its tests and
//! examples. Other binaries find the shared library the usual way (installed, or
//! `LD_LIBRARY_PATH`), or link statically.
//!
//! The layout check: the public items of the C headers and of `src/*.rs` are both parsed here
//! (the headers with a small parser that knows their style, the Rust sources by the
//! conventions in `src/lib.rs`); a C program printing `sizeof`/`_Alignof`/`offsetof` of every
//! item both sides declare, and the value of every constant, is compiled with `$CC` (default
//! `cc`) and run; `tests/layout.rs` compares its output with the same facts computed in Rust,
//! and the two item lists with each other.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let repo = manifest.join("../../..");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src");
    for v in [
        "CCQ_LIB_DIR",
        "CCQ_INCLUDE_DIR",
        "CCQ_STATIC",
        "CCQ_WITH_NCCL",
        "CCQ_WITH_MPI",
        "CCQ_WITH_UCX",
        "PKG_CONFIG_PATH",
        "CC",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }

    let include = link_library(&repo, &out);
    for h in HEADERS {
        println!("cargo:rerun-if-changed={}", include.join(h).display());
    }
    println!("cargo:include={}", include.display());
    let rpaths = RPATHS.lock().unwrap();
    if !rpaths.is_empty() {
        println!("cargo:rpath={}", rpaths.join(":"));
    }
    layout_check(&manifest, &include, &out);
}

/// Directories this package's binaries get an rpath to; passed on as `DEP_CCQ_RPATH`
/// (':'-separated; a metadata key keeps only its last value, so it is emitted once).
static RPATHS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn add_rpath(dir: &str) {
    println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    RPATHS.lock().unwrap().push(dir.to_string());
}

/// The headers the bindings cover.
const HEADERS: [&str; 3] = ["ccq.h", "ccq/version.h", "ccq/ccq_nccl.h"];

/// Emits the link directives; returns the include directory.
fn link_library(repo: &Path, out: &Path) -> PathBuf {
    let repo_include = repo.join("include");
    if let Some(lib) = env::var_os("CCQ_LIB_DIR").map(PathBuf::from) {
        let lib = absolute_dir("CCQ_LIB_DIR", &lib, &["libccq.so", "libccq.a"]);
        let include =
            env::var_os("CCQ_INCLUDE_DIR").map(|d| absolute_dir("CCQ_INCLUDE_DIR", Path::new(&d), &["ccq.h"]));
        let include = include.unwrap_or_else(|| {
            if repo_include.join("ccq.h").exists() {
                repo_include.clone()
            } else {
                lib.join("../include")
            }
        });
        println!("cargo:rustc-link-search=native={}", lib.display());
        if env::var("CCQ_STATIC").as_deref() == Ok("1") {
            link_static_deps(&lib);
        } else {
            link_shared(&lib);
        }
        return include;
    }
    if let Some(include) = from_pkg_config() {
        return include;
    }
    build_with_cmake(repo, out);
    repo_include
}

/// `dir` as an absolute path. A relative one (`CCQ_LIB_DIR=../../build`, as the README has
/// it) is meant relative to where the user ran cargo, but build scripts run in the package's
/// directory, rustc in the workspace's, and a relative path put into an rpath would be taken
/// relative to wherever the binary is later run from. So it is resolved here, against the
/// first of these that holds one of `marks`: the shell's working directory (`PWD`, where cargo
/// was run), the workspace (the parent of this package), this package.
fn absolute_dir(var: &str, dir: &Path, marks: &[&str]) -> PathBuf {
    if dir.is_absolute() {
        return dir.to_path_buf();
    }
    println!("cargo:rerun-if-env-changed=PWD"); // the same text may mean another directory
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let mut bases: Vec<PathBuf> =
        env::var_os("PWD").map(PathBuf::from).filter(|p| p.is_absolute()).into_iter().collect();
    bases.extend([manifest.join(".."), manifest]);
    for base in &bases {
        let cand = base.join(dir);
        if marks.iter().any(|m| cand.join(m).exists()) {
            return cand.canonicalize().unwrap_or(cand);
        }
    }
    let tried: Vec<String> = bases.iter().map(|b| b.join(dir).display().to_string()).collect();
    panic!("{var}={}: no {} in any of {}", dir.display(), marks.join(" or "), tried.join(", "));
}

fn link_shared(dir: &Path) {
    println!("cargo:rustc-link-lib=dylib=ccq");
    // Only this package's targets take rustc-link-arg; dependents get the directory as
    // DEP_CCQ_RPATH and add it themselves (the ccq crate's build.rs does).
    add_rpath(&dir.display().to_string());
}

/// libccq.a in `dir`, plus what it needs: the `Libs.private` of the `ccq.pc` next to it (a
/// build directory's, or `dir/pkgconfig/`), which names ck, pthread, m and whatever the build
/// found (CUDA's runtime and NCCL, MPI); without one, ck, pthread and m.
fn link_static_deps(dir: &Path) {
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=static=ccq");
    let mut path = env::join_paths([dir.to_path_buf(), dir.join("pkgconfig")]).unwrap();
    if let Some(old) = env::var_os("PKG_CONFIG_PATH") {
        path = env::join_paths(env::split_paths(&path).chain(env::split_paths(&old))).unwrap();
    }
    let pc = Command::new("pkg-config").args(["--static", "--libs", "ccq"]).env("PKG_CONFIG_PATH", path).output();
    let flags = match pc {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => {
            let ck = Command::new("pkg-config").args(["--libs", "ck"]).output().ok().filter(|o| o.status.success());
            let ck = ck.map_or("-lck".into(), |o| String::from_utf8_lossy(&o.stdout).into_owned());
            format!("{ck} -lpthread -lm")
        }
    };
    for f in flags.split_whitespace() {
        if let Some(d) = f.strip_prefix("-L") {
            // The .pc's own libdir (relative to an install prefix) may not exist here.
            if Path::new(d).is_dir() && Path::new(d) != dir {
                println!("cargo:rustc-link-search=native={d}");
                add_rpath(d); // shared dependencies outside the loader's path (CUDA, MPI)
            }
        } else if let Some(l) = f.strip_prefix("-l").filter(|&l| l != "ccq") {
            println!("cargo:rustc-link-lib={l}");
        }
    }
}

/// Emits `-L`/`-l` flags of a pkg-config answer; with `rpath`, an rpath per `-L`.
fn emit_pkg_libs(flags: &str, rpath: bool) {
    for f in flags.split_whitespace() {
        if let Some(d) = f.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={d}");
            if rpath {
                add_rpath(d);
            }
        } else if let Some(l) = f.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={l}");
        }
    }
}

fn from_pkg_config() -> Option<PathBuf> {
    let o = Command::new("pkg-config").args(["--libs", "--cflags", "ccq"]).output().ok()?;
    if !o.status.success() {
        return None;
    }
    let flags = String::from_utf8_lossy(&o.stdout).into_owned();
    emit_pkg_libs(&flags, true);
    let include = flags
        .split_whitespace()
        .find_map(|f| f.strip_prefix("-I"))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/include"));
    Some(include)
}

fn build_with_cmake(repo: &Path, out: &Path) {
    for d in ["CMakeLists.txt", "include", "runtime", "queue", "backends", "cmake"] {
        println!("cargo:rerun-if-changed={}", repo.join(d).display());
    }
    let build = out.join("build");
    let nccl = env::var("CCQ_WITH_NCCL").unwrap_or_else(|_| "AUTO".into());
    let mpi = env::var("CCQ_WITH_MPI").unwrap_or_else(|_| "AUTO".into());
    let ucx = env::var("CCQ_WITH_UCX").unwrap_or_else(|_| "AUTO".into());
    run(Command::new("cmake")
        .arg("-S")
        .arg(repo)
        .arg("-B")
        .arg(&build)
        .args(["-DCCQ_BUILD_TESTS=OFF", "-DCCQ_BUILD_BENCH=OFF", "-DCCQ_BUILD_EXAMPLES=OFF"])
        .arg(format!("-DCCQ_WITH_NCCL={nccl}"))
        .arg(format!("-DCCQ_WITH_MPI={mpi}"))
        .arg(format!("-DCCQ_WITH_UCX={ucx}"))
        .arg("-DCMAKE_BUILD_TYPE=RelWithDebInfo"));
    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "2".into());
    run(Command::new("cmake").arg("--build").arg(&build).args(["--target", "ccq_static", "-j", &jobs]));
    link_static_deps(&build);
}

fn run(cmd: &mut Command) {
    let o = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !o.status.success() {
        panic!(
            "{cmd:?} failed:\n{}\n{}\n(set CCQ_LIB_DIR to a directory holding a built libccq instead)",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

// ---- the item lists --------------------------------------------------------------------

/// Public items of one side. Struct fields are "struct.field".
#[derive(Default)]
struct Items {
    fns: BTreeSet<String>,
    consts: BTreeSet<String>,
    typedefs: BTreeSet<String>,
    structs: BTreeMap<String, Vec<String>>,
    opaque: BTreeSet<String>,
}

impl Items {
    fn lines(&self, side: &str, s: &mut String) {
        for f in &self.fns {
            writeln!(s, "{side} fn {f}").unwrap();
        }
        for c in &self.consts {
            writeln!(s, "{side} const {c}").unwrap();
        }
        for t in &self.typedefs {
            writeln!(s, "{side} type {t}").unwrap();
        }
        for o in &self.opaque {
            writeln!(s, "{side} opaque {o}").unwrap();
        }
        for (name, fields) in &self.structs {
            writeln!(s, "{side} struct {name}").unwrap();
            for f in fields {
                writeln!(s, "{side} field {name}.{f}").unwrap();
            }
        }
    }
}

fn strip_c_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let (mut i, mut in_str) = (0, false);
    while i < b.len() {
        if in_str {
            if b[i] == b'\\' && i + 1 < b.len() {
                out.push(b[i] as char);
                i += 1;
            } else if b[i] == b'"' {
                in_str = false;
            }
            out.push(b[i] as char);
            i += 1;
        } else if b[i] == b'"' {
            in_str = true;
            out.push('"');
            i += 1;
        } else if src[i..].starts_with("/*") {
            i = src[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
            out.push(' ');
        } else if src[i..].starts_with("//") {
            i = src[i..].find('\n').map_or(b.len(), |e| i + e);
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out.replace("\\\n", " ")
}

fn ident_at_end(s: &str) -> Option<String> {
    let s = s.trim_end();
    let start = s.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |p| p + 1);
    let id = &s[start..];
    (!id.is_empty() && !id.starts_with(|c: char| c.is_ascii_digit())).then(|| id.to_string())
}

fn ident_at_start(s: &str) -> Option<String> {
    let s = s.trim_start();
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    (end > 0).then(|| s[..end].to_string())
}

/// Parses the public items of ccq's headers (their style: typedef'd enums and structs,
/// `CCQ_API` functions, object-like `CCQ_*` macros, X-macro maps named `*_MAP`).
fn parse_headers(include: &Path) -> Items {
    let mut items = Items::default();
    let mut maps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut code = String::new();
    for h in HEADERS {
        let path = include.join(h);
        let src = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut cplusplus = false; // inside `#ifdef __cplusplus` (the `extern "C" {` lines)
        for line in strip_c_comments(&src).lines() {
            let t = line.trim_start();
            if let Some(rest) = t.strip_prefix('#') {
                let rest = rest.trim_start();
                if rest.starts_with("ifdef __cplusplus") {
                    cplusplus = true;
                } else if rest.starts_with("endif") {
                    cplusplus = false;
                }
                if let Some(def) = rest.strip_prefix("define") {
                    let def = def.trim_start();
                    let name = ident_at_start(def).unwrap_or_default();
                    let after = &def[name.len()..];
                    if after.starts_with('(') {
                        if name.ends_with("_MAP") {
                            let members = after.split("X(").skip(1).filter_map(ident_at_start).collect();
                            maps.insert(name, members);
                        }
                    } else if name.starts_with("CCQ_") && !name.ends_with("_H") && name != "CCQ_API" {
                        items.consts.insert(name);
                    }
                }
                continue;
            }
            if cplusplus {
                continue;
            }
            code.push_str(line);
            code.push('\n');
        }
    }
    // Split the code into top-level declarations at ';' outside braces.
    let (mut depth, mut decl) = (0, String::new());
    let mut decls = Vec::new();
    for c in code.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ';' && depth == 0 {
            decls.push(decl.split_whitespace().collect::<Vec<_>>().join(" "));
            decl.clear();
        } else {
            decl.push(c);
        }
    }
    for d in decls {
        let d = d.trim();
        if let Some(rest) = d.strip_prefix("CCQ_API ") {
            let paren = rest.find('(').expect("function declaration");
            // `void(name)(args)`: a name in parentheses (kept from a function-like macro).
            let inner = ident_at_start(&rest[paren + 1..]).filter(|id| {
                let after = rest[paren + 1 + id.len()..].trim_start();
                after.strip_prefix(')').is_some_and(|a| a.trim_start().starts_with('('))
            });
            items.fns.insert(inner.or_else(|| ident_at_end(&rest[..paren])).unwrap());
        } else if let Some(rest) = d.strip_prefix("typedef ") {
            let name = ident_at_end(d).unwrap_or_default();
            if let (Some(open), Some(close)) = (rest.find('{'), rest.rfind('}')) {
                let body = &rest[open + 1..close];
                if rest.starts_with("enum") {
                    for m in body.split(',') {
                        let Some(id) = ident_at_start(m) else { continue };
                        if let Some(members) = m.contains('(').then(|| maps.get(&id)).flatten() {
                            items.consts.extend(members.iter().cloned());
                        } else {
                            items.consts.insert(id);
                        }
                    }
                    items.typedefs.insert(name);
                } else {
                    let mut fields = Vec::new();
                    for f in body.split(';').map(str::trim).filter(|f| !f.is_empty()) {
                        if let Some(p) = f.find("(*") {
                            // A function pointer: `ret (*name)(args)`.
                            fields.push(ident_at_start(&f[p + 2..]).unwrap());
                            continue;
                        }
                        let f = f.split('[').next().unwrap();
                        let mut parts = f.split(',');
                        fields.push(ident_at_end(parts.next().unwrap()).unwrap());
                        fields.extend(parts.filter_map(ident_at_start));
                    }
                    items.structs.insert(name, fields);
                }
            } else if let Some(p) = rest.find("(*") {
                items.typedefs.insert(ident_at_start(&rest[p + 2..]).unwrap());
            } else if rest.starts_with("struct ") {
                items.opaque.insert(name);
            } else {
                items.typedefs.insert(name);
            }
        } else if let Some(rest) = d.strip_prefix("struct ") {
            if !rest.contains(' ') {
                items.opaque.insert(rest.to_string());
            }
        }
    }
    items
}

/// Rust-side facts the generated code needs beyond the names.
#[derive(Default)]
struct RustInfo {
    const_types: BTreeMap<String, String>,
    typedef_types: BTreeMap<String, String>,
}

/// Parses `src/*.rs` by the conventions stated in `src/lib.rs`.
fn parse_rust(src_dir: &Path) -> (Items, RustInfo) {
    let mut items = Items::default();
    let mut info = RustInfo::default();
    let mut files: Vec<_> = fs::read_dir(src_dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for path in files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "rs")) {
        let src = fs::read_to_string(&path).unwrap();
        let mut lines = src.lines().peekable();
        let mut in_extern = false;
        while let Some(line) = lines.next() {
            let t = line.trim();
            if t.starts_with("extern \"C\" {") {
                in_extern = true;
            } else if in_extern && line.starts_with('}') {
                in_extern = false;
            } else if let Some(rest) = t.strip_prefix("pub fn ") {
                if in_extern {
                    items.fns.insert(ident_at_start(rest).unwrap());
                }
            } else if let Some(rest) = t.strip_prefix("pub const ") {
                let name = ident_at_start(rest).unwrap();
                let ty = rest[name.len() + 1..].split('=').next().unwrap().trim().to_string();
                info.const_types.insert(name.clone(), ty);
                items.consts.insert(name);
            } else if let Some(rest) = t.strip_prefix("pub type ") {
                let name = ident_at_start(rest).unwrap();
                let mut ty = rest[name.len()..].trim_start().trim_start_matches('=').to_string();
                while !ty.trim_end().ends_with(';') {
                    ty.push_str(lines.next().unwrap().trim());
                }
                info.typedef_types.insert(name.clone(), ty.trim().trim_end_matches(';').trim().to_string());
                items.typedefs.insert(name);
            } else if let Some(rest) = t.strip_prefix("pub struct ") {
                let name = ident_at_start(rest).unwrap();
                let mut fields = Vec::new();
                for l in lines.by_ref() {
                    let l = l.trim();
                    if l.starts_with('}') {
                        break;
                    }
                    if let Some(f) = l.strip_prefix("pub ") {
                        fields.push(ident_at_start(f.trim_start_matches("r#")).unwrap());
                    }
                }
                if fields.is_empty() {
                    items.opaque.insert(name);
                } else {
                    items.structs.insert(name, fields);
                }
            }
        }
    }
    (items, info)
}

const RUST_INTS: [&str; 12] =
    ["u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64", "isize", "c_int", "c_uint"];

/// The layout program, its output, the Rust side's facts and both item lists.
fn layout_check(manifest: &Path, include: &Path, out: &Path) {
    let header = parse_headers(include);
    let (rust, info) = parse_rust(&manifest.join("src"));
    let mut api = String::new();
    header.lines("header", &mut api);
    rust.lines("rust", &mut api);
    fs::write(out.join("api_items.txt"), api).unwrap();

    // Only items both sides declare go into the program (a difference in the lists is
    // reported by the test, not as a C compile error here).
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <ccq.h>\n#include <ccq/ccq_nccl.h>\n\
         #define SIGNED(t) ((t)-1 < (t)0)\nint main(void)\n{\n",
    );
    let mut r = String::from(
        "/// Facts about the Rust declarations, keyed as the C program prints them.\n\
         #[allow(unused_parens, clippy::unnecessary_cast)]\n\
         pub fn rust_layout() -> Vec<(&'static str, String)> {\n\
         fn field_size<T, F>(_: fn(&T) -> &F) -> usize { ::std::mem::size_of::<F>() }\n\
         vec![\n",
    );
    for (name, fields) in &rust.structs {
        let Some(cfields) = header.structs.get(name) else { continue };
        writeln!(c, "printf(\"size {name} %zu\\n\", sizeof({name}));").unwrap();
        writeln!(c, "printf(\"align {name} %zu\\n\", (size_t)_Alignof({name}));").unwrap();
        writeln!(r, "(\"size {name}\", ::std::mem::size_of::<{name}>().to_string()),").unwrap();
        writeln!(r, "(\"align {name}\", ::std::mem::align_of::<{name}>().to_string()),").unwrap();
        for f in fields.iter().filter(|f| cfields.contains(f)) {
            let rf = if f == "type" { "r#type" } else { f };
            writeln!(c, "printf(\"offset {name}.{f} %zu\\n\", offsetof({name}, {f}));").unwrap();
            writeln!(c, "printf(\"fsize {name}.{f} %zu\\n\", sizeof((({name} *)0)->{f}));").unwrap();
            writeln!(r, "(\"offset {name}.{f}\", ::std::mem::offset_of!({name}, {rf}).to_string()),").unwrap();
            writeln!(r, "(\"fsize {name}.{f}\", field_size(|s: &{name}| &s.{rf}).to_string()),").unwrap();
        }
    }
    for name in rust.typedefs.intersection(&header.typedefs) {
        writeln!(c, "printf(\"size {name} %zu\\n\", sizeof({name}));").unwrap();
        writeln!(r, "(\"size {name}\", ::std::mem::size_of::<{name}>().to_string()),").unwrap();
        if RUST_INTS.contains(&info.typedef_types[name].as_str()) {
            writeln!(c, "printf(\"signed {name} %d\\n\", SIGNED({name}));").unwrap();
            writeln!(r, "(\"signed {name}\", (((!(0 as {name})) < (0 as {name})) as i32).to_string()),").unwrap();
        }
    }
    for name in rust.consts.intersection(&header.consts) {
        if info.const_types[name].contains("str") {
            writeln!(c, "printf(\"const {name} %s\\n\", {name});").unwrap();
            writeln!(r, "(\"const {name}\", {name}.to_string()),").unwrap();
        } else {
            writeln!(c, "printf(\"const {name} %lld\\n\", (long long)({name}));").unwrap();
            writeln!(r, "(\"const {name}\", ({name} as i128).to_string()),").unwrap();
        }
    }
    c.push_str("return 0;\n}\n");
    r.push_str("]\n}\n");
    fs::write(out.join("layout.c"), &c).unwrap();
    fs::write(out.join("layout_rust.rs"), &r).unwrap();

    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let exe = out.join("layout");
    run(Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(out.join("layout.c"))
        .arg("-I")
        .arg(include));
    let o = Command::new(&exe).output().expect("run the layout program");
    assert!(o.status.success(), "the layout program failed");
    fs::write(out.join("layout_c.txt"), o.stdout).unwrap();
}

//! Writes the random programs into `OUT_DIR`: `batch_K.rs`, each one `fuse!` of up to
//! `PER_BATCH` functions with their glue, and `programs.rs`, the table the tests read.
//!
//! The programs are generated at build time, from fixed seeds, rather than checked in: the same
//! generator then makes a batch of any size (`FUSE_RANDOM_PROGRAMS=N` at build time, 300 by
//! default), and a change to the generator needs no regenerated files in review.
//! `FUSE_RANDOM_FIRST=K` starts the batch at program `K` (0 by default): a run of many
//! thousands of programs is built as several binaries of a few thousand each, since one crate of
//! ten thousand `fuse!` functions takes more memory to compile than the build machine has.
//! `FUSE_RANDOM_PICK=1806,2067` builds those programs alone, to replay what such a run found.
//! A program is a function of its seed alone, so a failure names the seed, and `regressions.rs`
//! keeps a failing program's text and description by value.

#[path = "gen/mod.rs"]
mod gen;

use std::fmt::Write;

/// Programs a `fuse!`: one macro expansion, one module, one codegen unit's worth of work.
const PER_BATCH: usize = 25;

/// The seed of program `k`.
fn seed(k: usize) -> u64 {
    0x5eed_0000_0000_0000 ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn main() {
    println!("cargo:rerun-if-changed=gen");
    println!("cargo:rerun-if-env-changed=FUSE_RANDOM_PROGRAMS");
    println!("cargo:rerun-if-env-changed=FUSE_RANDOM_FIRST");
    println!("cargo:rerun-if-env-changed=FUSE_RANDOM_PICK");
    let number = |name: &str, default: usize| -> usize {
        std::env::var(name).ok().map_or(default, |v| {
            v.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{name}={v} is not a number: {e}"))
        })
    };
    let count = number("FUSE_RANDOM_PROGRAMS", 300);
    let first = number("FUSE_RANDOM_FIRST", 0);
    // `FUSE_RANDOM_PICK=1806,2067`: these programs alone, to replay what a large run found.
    let picked: Vec<usize> = std::env::var("FUSE_RANDOM_PICK")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(|k| {
            k.trim_start_matches('p')
                .parse()
                .unwrap_or_else(|e| panic!("FUSE_RANDOM_PICK: {k} is not a program: {e}"))
        })
        .collect();
    let ks: Vec<usize> = match picked.is_empty() {
        true => (first..first + count).collect(),
        false => picked,
    };
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let programs: Vec<gen::Program> = ks
        .into_iter()
        .map(|k| gen::program(&format!("p{k}"), seed(k)))
        .collect();
    let mut table = String::from("pub static PROGRAMS: &[Program] = &[\n");
    let mut mods = String::new();
    for (b, batch) in programs.chunks(PER_BATCH).enumerate() {
        let mut file = String::from(
            "use crate::harness::{Args, Out};\n#[allow(unused_imports)]\n\
             use fuse_runtime::{bf16, f16, fuse, Device, Error};\n\nfuse! {\n",
        );
        for p in batch {
            file.push_str(&p.text);
            file.push('\n');
        }
        file.push_str("}\n\n");
        for p in batch {
            file.push_str(&p.glue);
            let derive = match &p.derive {
                Some(glue) => {
                    file.push_str(glue);
                    format!("Some(batch_{b}::derive_{})", p.name)
                }
                None => "None".to_string(),
            };
            writeln!(
                table,
                "    Program {{ name: {:?}, seed: {:#x}, text: {:?}, desc: {:?}, run: batch_{b}::run_{}, derive: {derive} }},",
                p.name, p.seed, p.text, p.desc, p.name
            )
            .unwrap();
        }
        std::fs::write(out.join(format!("batch_{b}.rs")), file).expect("write a batch");
        writeln!(
            mods,
            "#[allow(clippy::all)]\npub mod batch_{b} {{ include!(concat!(env!(\"OUT_DIR\"), \"/batch_{b}.rs\")); }}"
        )
        .unwrap();
    }
    table.push_str("];\n");
    std::fs::write(out.join("programs.rs"), mods + &table).expect("write the table");
}

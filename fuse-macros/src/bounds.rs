//! A kernel's register bound, lowered where ptxas spills under it. `__launch_bounds__(256, N)`
//! caps a thread's registers at 65536 / 256 / N; the planner picks N for each entry
//! (`plan::tuning`), tuned on every kernel of the tests, benches and examples and on the random
//! programs, but a program nobody wrote, or another NVRTC, can still make ptxas spill under it.
//! Every compile of an entry therefore reads ptxas's report, and where it spills compiles again
//! with one block an SM fewer (an entry that declares no minimum takes one block, the most
//! registers), until none spills or the bound is one block: the entry keeps the fewest resident
//! blocks that hold its registers, rather than load and store them through local memory.
//!
//! Both compile paths take these same steps: the macro's build-time CUBINs (`cubin.rs`) and the
//! runtime's NVRTC (`fuse_runtime::nvrtc`), which takes this file's items through
//! `__compile_steps!`, so an embedded CUBIN and one compiled at run time stay the same.

/// The first `ptxas` report line with a non-zero spill, as in `8 bytes spill stores`, if any,
/// after the entry point it is about (`fuse_f: ptxas ...`) when the report names it. Give it
/// the log of a compile with `--ptxas-options=-v`.
pub fn spills(log: &str) -> Option<String> {
    let spills_bytes = |part: &str| {
        let part = part.trim();
        let count = part
            .strip_suffix("bytes spill stores")
            .or_else(|| part.strip_suffix("bytes spill loads"))?;
        count.trim().parse::<u64>().ok()
    };
    let mut entry = None;
    for line in log.lines() {
        if let Some((_, name)) = line.split_once("Function properties for ") {
            entry = Some(name.trim());
        }
        if line.split(',').filter_map(spills_bytes).any(|n| n > 0) {
            return Some(match entry {
                Some(name) => format!("{name}: {}", line.trim()),
                None => line.trim().to_string(),
            });
        }
    }
    None
}

/// `source` with its entry's `__launch_bounds__` one block an SM lower, `(256, 1)` where it
/// declares none; `None` where it declares one block already, or where `source` does not hold
/// exactly one `__launch_bounds__`, as every entry `fuse!` generates does.
pub fn relax_bound(source: &str) -> Option<String> {
    const BOUND: &str = "__launch_bounds__(";
    let start = source.find(BOUND)? + BOUND.len();
    if source[start..].contains(BOUND) {
        return None;
    }
    let end = start + source[start..].find(')')?;
    let relaxed = match source[start..end].split_once(',') {
        None => format!("{}, 1", source[start..end].trim()),
        Some((threads, blocks)) => match blocks.trim().parse::<u32>().ok()? {
            0 | 1 => return None,
            blocks => format!("{}, {}", threads.trim(), blocks - 1),
        },
    };
    Some(format!("{}{relaxed}{}", &source[..start], &source[end..]))
}

/// Compiles an entry's `source` through `compile`, which gives what it built and its log with
/// ptxas's report (`--ptxas-options=-v`), and again with the bound lowered ([`relax_bound`]) for
/// as long as the report shows a spill and the bound can go lower. Returns the last compile's
/// output and log, and how many blocks an SM it took off the declared bound.
pub fn compile_relaxed<T, E>(
    source: &str,
    mut compile: impl FnMut(&str) -> Result<(T, String), E>,
) -> Result<(T, String, u32), E> {
    let (mut built, mut log) = compile(source)?;
    let mut text = std::borrow::Cow::Borrowed(source);
    let mut lowered = 0;
    while spills(&log).is_some() {
        let Some(relaxed) = relax_bound(&text) else {
            break;
        };
        (built, log) = compile(&relaxed)?;
        text = std::borrow::Cow::Owned(relaxed);
        lowered += 1;
    }
    Ok((built, log, lowered))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY: &str = "extern \"C\" __global__ void __launch_bounds__(256, 3) fuse_f(\n) {}\n";

    #[test]
    fn the_bound_goes_down_a_block_at_a_time_to_one() {
        let two = relax_bound(ENTRY).unwrap();
        assert_eq!(two, ENTRY.replace("(256, 3)", "(256, 2)"));
        let one = relax_bound(&two).unwrap();
        assert_eq!(one, ENTRY.replace("(256, 3)", "(256, 1)"));
        assert_eq!(relax_bound(&one), None);
        let unbounded = ENTRY.replace("(256, 3)", "(256)");
        assert_eq!(
            relax_bound(&unbounded).unwrap(),
            one,
            "none declared: one block"
        );
        assert_eq!(relax_bound("__global__ void k() {}"), None);
        let two_entries = format!("{ENTRY}{ENTRY}");
        assert_eq!(relax_bound(&two_entries), None, "not an entry of fuse!");
    }

    #[test]
    fn an_entry_is_compiled_again_only_while_it_spills() {
        let report = |spilled: u32| {
            format!("ptxas info    : Function properties for fuse_f\n    0 bytes stack frame, {spilled} bytes spill stores, {spilled} bytes spill loads\n")
        };
        // ptxas of this test spills 8 bytes above two blocks an SM.
        let mut seen = vec![];
        let compile = |text: &str| {
            seen.push(text.to_string());
            let spill = match text.contains("(256, 3)") || text.contains("(256, 4)") {
                true => 8,
                false => 0,
            };
            Ok::<_, ()>((text.len(), report(spill)))
        };
        let (_, log, lowered) = compile_relaxed(&ENTRY.replace("3)", "4)"), compile).unwrap();
        assert_eq!((lowered, spills(&log)), (2, None));
        assert_eq!(seen.len(), 3);
        assert!(seen[2].contains("__launch_bounds__(256, 2) fuse_f("));
        let clean = |text: &str| Ok::<_, ()>((text.len(), report(0)));
        assert_eq!(compile_relaxed(ENTRY, clean).unwrap().2, 0);
        // At one block ptxas has every register it can give: the last compile is kept.
        let always = |text: &str| Ok::<_, ()>((text.to_string(), report(4)));
        let (text, log, lowered) = compile_relaxed(ENTRY, always).unwrap();
        assert!(text.contains("(256, 1)") && spills(&log).is_some() && lowered == 2);
        let failing = |_: &str| Err::<(usize, String), _>("a compile error");
        assert_eq!(
            compile_relaxed(ENTRY, failing).err(),
            Some("a compile error")
        );
    }

    #[test]
    fn the_runtime_can_take_these_items() {
        let file: syn::File =
            syn::parse_str(&crate::compile_steps()).expect("bounds.rs without its module docs");
        assert!(file.attrs.is_empty(), "no inner attribute left");
        let names: Vec<String> = file
            .items
            .iter()
            .filter_map(|item| match item {
                syn::Item::Fn(f) => Some(f.sig.ident.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(
            names,
            ["spills", "relax_bound", "compile_relaxed"],
            "and not the tests"
        );
    }
}

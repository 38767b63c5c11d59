//! Every random program on the CPU backend against the oracle, on several shapes each
//! (`FUSE_RANDOM_SHAPES`, 4 by default). Failures are collected, so one run reports all of them.
//! The programs that write through `&mut` parameters are counted apart: the run fails unless
//! some wrote, left elements alone and dropped elements at indices outside, all checked.

use random_programs::harness::Counts;
use random_programs::oracle::{Desc, WriteStats};
use random_programs::run::{check_cpu, selected, Config};

#[test]
fn random_programs_match_the_oracle_on_the_cpu() {
    let cfg = Config::from_env(4, 1 << 15);
    let programs = selected();
    let mut failures = vec![];
    let (mut runs, mut n) = (0, Counts::default());
    let (mut writers, mut write_runs, mut w) = (0, 0, WriteStats::default());
    for p in &programs {
        let desc = Desc::parse(p.desc);
        let writes = !desc.writes.is_empty();
        writers += writes as usize;
        for k in 0..cfg.shapes {
            runs += 1;
            match check_cpu(p, &desc, k, &cfg) {
                Ok((counts, stats)) => {
                    n += counts;
                    write_runs += writes as usize;
                    w.stored += stats.stored;
                    w.below += stats.below;
                    w.past += stats.past;
                    w.untouched += stats.untouched;
                }
                Err(e) => {
                    failures.push(e);
                    break;
                }
            }
        }
    }
    eprintln!(
        "{} programs, {runs} runs, {} of {} output elements checked against the oracle (the rest \
         depend on a decision the oracle's error bounds leave open), {} failures",
        programs.len(),
        n.checked,
        n.total,
        failures.len()
    );
    eprintln!(
        "of those, {writers} programs write through `&mut` parameters: {write_runs} runs, {} of \
         {} elements of the written buffers checked ({} stored, {} left alone; {} not stored at \
         an index below 0, {} at one past the rows)",
        n.buffer_checked, n.buffer_total, w.stored, w.untouched, w.below, w.past
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    // Not vacuous: the batch has programs with writes, and (unless `FUSE_RANDOM_ONLY` picked
    // none of them) their runs stored, skipped and kept elements, and checked the buffers.
    let all_writers = random_programs::PROGRAMS
        .iter()
        .filter(|p| !Desc::parse(p.desc).writes.is_empty())
        .count();
    assert!(all_writers > 0, "no program of the batch writes");
    if writers > 0 && cfg.shapes >= 4 {
        assert!(
            n.buffer_checked > 0,
            "no written buffer's element was checked"
        );
        assert!(w.stored > 0 && w.untouched > 0, "{w:?}");
        if writers >= 10 {
            assert!(w.below > 0 && w.past > 0, "{w:?}");
        }
    }
}

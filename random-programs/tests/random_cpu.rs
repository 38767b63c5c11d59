//! Every random program on the CPU backend against the oracle, on several shapes each
//! (`FUSE_RANDOM_SHAPES`, 4 by default). Failures are collected, so one run reports all of them.

use random_programs::oracle::Desc;
use random_programs::run::{check_cpu, selected, Config};

#[test]
fn random_programs_match_the_oracle_on_the_cpu() {
    let cfg = Config::from_env(4, 1 << 15);
    let programs = selected();
    let mut failures = vec![];
    let (mut runs, mut checked, mut total) = (0, 0, 0);
    for p in &programs {
        let desc = Desc::parse(p.desc);
        for k in 0..cfg.shapes {
            runs += 1;
            match check_cpu(p, &desc, k, &cfg) {
                Ok((n, all)) => {
                    checked += n;
                    total += all;
                }
                Err(e) => {
                    failures.push(e);
                    break;
                }
            }
        }
    }
    eprintln!(
        "{} programs, {runs} runs, {checked} of {total} output elements checked against the \
         oracle (the rest depend on a decision the oracle's error bounds leave open), {} failures",
        programs.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

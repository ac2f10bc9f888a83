//! The classes' figures and verdicts as the statistics and `mrcache info` show them.

use super::*;

impl Classes {
    /// Every class that has figures, as (access, class, figures).
    pub(crate) fn measured(&self) -> impl Iterator<Item = (Access, u32, &Figures)> {
        self.figures.iter().enumerate().filter_map(|(i, f)| {
            let access = Access::ALL[i / CLASSES];
            (f.reg.samples > 0 || f.pass_reg.samples > 0 || f.hit.samples > 0).then_some((
                access,
                (i % CLASSES) as u32,
                f,
            ))
        })
    }

    /// The measured classes for the statistics report.
    pub fn to_report(&self) -> Vec<crate::stats::AdmissionClass> {
        self.measured()
            .map(|(a, c, f)| {
                let k = f.costs(a);
                let from = if a == Access::Local && f.round.samples > 0 {
                    ("lock-free round", f.round.samples)
                } else if f.hit.samples > 0 && f.release.samples > 0 {
                    ("locked rounds", f.hit.samples.min(f.release.samples))
                } else {
                    ("none yet", 0)
                };
                crate::stats::AdmissionClass {
                    access: a.name().into(),
                    class: class_name(c),
                    verdict: f.verdict_shown(a).to_string(),
                    miss_ns: k.miss_ns.round(),
                    reg_ns: f.miss_reg().value.round(),
                    dereg_ns: f.miss_dereg().value.round(),
                    cached_ns: k.cached_ns.round(),
                    cached_from: from.0.into(),
                    evict_ns: k.evict_ns.round(),
                    samples: [f.miss_reg().samples, f.miss_dereg().samples, from.1],
                    passed: f.passed,
                    trials: f.trials,
                }
            })
            .collect()
    }

    /// One line per measured class: what was decided and on which figures.
    pub fn report(&self) -> Vec<String> {
        self.measured()
            .map(|(a, c, f)| {
                let k = f.costs(a);
                format!(
                    "{} {}: {} (miss {:.0} ns = reg {:.0} + dereg {:.0}; cached round {:.0} ns; eviction {:.0} ns; passed {}, trials {})",
                    a.name(),
                    class_name(c),
                    f.verdict_shown(a),
                    k.miss_ns,
                    f.reg.value,
                    f.dereg.value,
                    k.cached_ns,
                    k.evict_ns,
                    f.passed,
                    f.trials
                )
            })
            .collect()
    }
}

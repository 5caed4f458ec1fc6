//! The one skip/fail policy: whether a scenario runs, is skipped (with a typed reason) or
//! fails before it starts. Every host-profile kind goes through here: local, containers, SSH
//! pairs and the soft-RoCE VMs (whose "no VM here" reason is a skip like any other).

use std::path::Path;

use crate::hosts::probe::HostFacts;
use crate::hosts::profile::HostProfile;
use crate::model::failure::Failure;
use crate::model::requirement::{Requirement, SkipCode, SkipReason};
use crate::model::result::ScenarioResult;
use crate::model::scenario::{Fault, Perturb, Reach, Scenario, Strikes};
use serde_saphyr::Spanned;

/// What happens to a scenario before any rank starts.
#[derive(Debug, PartialEq)]
pub enum Decision {
    Run,
    Skip(SkipReason),
    /// A skip that must not be one (`must_have`, `--strict`).
    Fail(Failure),
}

impl Decision {
    /// The result a scenario gets when it does not run; `None` for [`Decision::Run`].
    pub fn result(&self, name: &str, file: &Path) -> Option<ScenarioResult> {
        match self {
            Decision::Run => None,
            Decision::Skip(why) => Some(ScenarioResult::skipped(name, file, why.clone())),
            Decision::Fail(why) => Some(ScenarioResult::failed_before_running(
                name,
                file,
                why.clone(),
            )),
        }
    }
}

/// The policy's inputs that do not change within a run.
pub struct Policy<'a> {
    pub profile: &'a HostProfile,
    pub facts: &'a [HostFacts],
    pub strict: bool,
    /// The fault planes the hosts take: killed, frozen or cut off (containers), their RoCE
    /// wire faulted (the soft-RoCE VM pair).
    pub strikes: Strikes,
    /// `--no-audit`: nothing runs under strace.
    pub no_audit: bool,
}

impl Policy<'_> {
    /// Decide one scenario: every host must meet every requirement; host-level faults need
    /// hosts the harness controls.
    pub fn decide<S: crate::model::scenario::StepSpec>(&self, s: &Scenario<S>) -> Decision {
        if let (Some(family), None) = (s.releases, &s.release) {
            let reason = SkipReason {
                code: family.skip_code(),
                detail: crate::hosts::releases::none_installed(family),
            };
            return self.unmet(reason, &[]);
        }
        for req in &s.requires {
            let unmet = self.facts.iter().find_map(|f| {
                f.check(*req, self.profile)
                    .err()
                    .map(|r| (f.host.clone(), r))
            });
            if let Some((host, mut reason)) = unmet {
                if self.facts.len() > 1 {
                    reason.detail = format!("on {host}: {}", reason.detail);
                }
                return self.unmet(reason, &[*req]);
            }
        }
        let mut audit = s.audit.iter().chain(&self.profile.audit);
        let traced =
            !self.no_audit && (!s.perturb.is_empty() || audit.clone().any(|c| c.reads_syscalls()));
        if !self.no_audit && audit.any(|c| !c.reads_syscalls()) {
            if let Some(reason) = no_verbs_observer(self.profile) {
                return self.unmet(reason, &[]);
            }
        }
        // strace is needed for perturbations the preloaded observer cannot delay (it injects
        // them), and wherever any host of the run cannot record with eBPF (the run then
        // records with strace on every host).
        let ebpf_everywhere = self.facts.iter().all(|f| f.ebpf_absent.is_none());
        let injected = !s.perturb.is_empty() && !observer_delays(&s.perturb);
        let needs_strace = traced && (injected || !ebpf_everywhere);
        if let Some(f) = self.facts.iter().find(|f| needs_strace && !f.strace) {
            let why = if !injected {
                "the lifecycle audit records syscalls with strace where eBPF cannot"
            } else {
                "perturbations are injected by strace"
            };
            let reason = SkipReason {
                code: SkipCode::NoStrace,
                detail: format!("{why}, which {} lacks: install Debian's `strace`", f.host),
            };
            return self.unmet(reason, &[]);
        }
        if let Some(f) = s
            .all_faults()
            .into_iter()
            .find(|f| !self.strikes.allows(f.action))
        {
            return self.unmet(no_host_control(&f, self.profile), &[]);
        }
        Decision::Run
    }

    /// A reason the scenario cannot run here: a skip, unless `--strict` or the profile's
    /// `must_have` (for any of `requires`) says this hardware must be there.
    pub fn unmet(&self, reason: SkipReason, requires: &[Requirement]) -> Decision {
        let must = requires.iter().any(|r| self.profile.must_have.contains(r));
        if self.strict || must {
            let why = if self.strict {
                "--strict"
            } else {
                "the host profile's must_have"
            };
            Decision::Fail(Failure::Unmet {
                skip: reason,
                by: why.into(),
            })
        } else {
            Decision::Skip(reason)
        }
    }
}

fn no_host_control(f: &Fault, profile: &HostProfile) -> SkipReason {
    let (code, what, who) = match f.action.reach() {
        Reach::Wire => (
            SkipCode::NoWireControl,
            "a RoCE wire between two hosts",
            "only the rxe-vm-pair profile",
        ),
        _ => (
            SkipCode::NoHostControl,
            "a whole host",
            "only the containers profile (or a Slurm test cluster)",
        ),
    };
    SkipReason {
        code,
        detail: format!(
            "the {:?} fault acts on {what}, which {who} can do (`{}` is {:?})",
            f.action,
            profile.name,
            profile.kind()
        ),
    }
}

/// Why the verbs audit cannot run here, if it cannot: this build lacks the observer, or the
/// ranks are Slurm tasks (their launch does not pass it on).
/// Whether the preloaded observer will delay `perturb`'s calls (the runner's own choice; a
/// static program still falls back to strace when it runs).
fn observer_delays(perturb: &[Spanned<Perturb>]) -> bool {
    let perturb: Vec<Perturb> = perturb.iter().map(|p| p.value.clone()).collect();
    crate::orchestration::audit::perturb_mechanism(&perturb, &[], false).0
        == crate::orchestration::audit::PerturbBy::Preload
}

fn no_verbs_observer(profile: &HostProfile) -> Option<SkipReason> {
    let detail = if !crate::rank::verbs_observer::available() {
        "this wringer was built without the verbs observer: install libibverbs-dev and librdmacm-dev, then rebuild"
    } else if matches!(profile.kind(), crate::hosts::profile::ProfileKind::Slurm) {
        "the verbs audit does not reach Slurm tasks yet"
    } else {
        return None;
    };
    Some(SkipReason {
        code: SkipCode::NoVerbsObserver,
        detail: detail.into(),
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::hosts::profile;
    use crate::rank::steps::{self, Loaded};

    fn repo(p: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
    }

    /// A host without RDMA or GPU.
    fn bare() -> HostFacts {
        let mut f = crate::hosts::probe::local();
        f.rdma_absent = Some("/sys/class/infiniband is absent".into());
        f.rdma_devices = vec![];
        f.gpus = vec![];
        f.gpu_absent = Some("no NVIDIA driver".into());
        f
    }

    fn scenario(name: &str) -> Loaded {
        steps::load(&repo(&format!("scenarios/{name}.yaml"))).unwrap()
    }

    fn decide(profile: &str, strict: bool, host_control: bool, s: &str) -> Decision {
        let p = profile::load(&repo(&format!("hosts/{profile}.yaml"))).unwrap();
        let facts = [bare()];
        let policy = Policy {
            profile: &p,
            facts: &facts,
            strict,
            strikes: Strikes {
                host: host_control,
                wire: false,
            },
            no_audit: false,
        };
        policy.decide(&scenario(s).scenario)
    }

    #[test]
    fn a_scenario_whose_requirements_are_met_runs() {
        assert_eq!(
            decide("local", false, false, "tcp-exact-reads"),
            Decision::Run
        );
    }

    #[test]
    fn a_release_scenario_with_no_release_installed_is_a_skip_that_names_the_recipe() {
        // Loaded without expanding releases: no release was put in, as when none is installed.
        let Decision::Skip(why) = decide("local", false, false, "torch-gloo-lazy-rank-exits")
        else {
            panic!("expected a skip")
        };
        assert_eq!(why.code, SkipCode::NoTorch);
        let why = why.to_string();
        assert!(
            why.starts_with("no-torch: no torch release is installed"),
            "{why}"
        );
        assert!(
            why.contains("`just external-torch`") && why.contains("WRINGER_TORCH"),
            "{why}"
        );
        // With a release put in, it runs.
        let mut s = scenario("torch-gloo-lazy-rank-exits").scenario;
        s.release = Some(crate::model::scenario::Release {
            version: "2.15.0".into(),
            root: "/opt/torch".into(),
        });
        let p = profile::load(&repo("hosts/local.yaml")).unwrap();
        let facts = [bare()];
        let policy = Policy {
            profile: &p,
            facts: &facts,
            strict: false,
            strikes: Strikes::default(),
            no_audit: false,
        };
        assert_eq!(policy.decide(&s), Decision::Run);
    }

    #[test]
    fn missing_hardware_is_a_typed_skip() {
        let Decision::Skip(why) = decide("local", false, false, "rdma-pingpong") else {
            panic!("expected a skip")
        };
        assert_eq!(why.code, SkipCode::NoRdmaDevice, "{why}");
    }

    #[test]
    fn strict_turns_every_skip_into_a_failure() {
        let Decision::Fail(Failure::Unmet { skip, by }) =
            decide("local", true, false, "rdma-pingpong")
        else {
            panic!("expected a failure")
        };
        assert_eq!(
            (skip.code, by.as_str()),
            (SkipCode::NoRdmaDevice, "--strict")
        );
    }

    #[test]
    fn hardware_the_profile_must_have_fails_when_missing() {
        let Decision::Fail(why) = decide("rxe", false, false, "rdma-pingpong") else {
            panic!("expected a failure")
        };
        assert!(why.to_string().contains("must_have"), "{why}");
    }

    #[test]
    fn an_audited_scenario_reads_syscalls_unless_the_audit_is_off() {
        let s = scenario("tcp-teardown-cycles");
        assert!(!s.scenario.audit.is_empty());
        let p = profile::load(&repo("hosts/local.yaml")).unwrap();
        let mut f = bare();
        f.strace = false;
        f.ebpf_absent = Some("loading BPF programs needs root".into());
        let facts = [f];
        let mut policy = Policy {
            profile: &p,
            facts: &facts,
            strict: false,
            strikes: Strikes::default(),
            no_audit: false,
        };
        let Decision::Skip(why) = policy.decide(&s.scenario) else {
            panic!("expected a skip")
        };
        assert_eq!(why.code, SkipCode::NoStrace, "{why}");
        policy.no_audit = true;
        assert_eq!(policy.decide(&s.scenario), Decision::Run);
        // With eBPF, its perturbation (a `poll` exit delay) needs no strace: the preloaded
        // observer delays it.
        let mut f = bare();
        f.strace = false;
        f.ebpf_absent = None;
        let facts = [f];
        policy.facts = &facts;
        policy.no_audit = false;
        if crate::rank::perturb_observer::available() {
            assert_eq!(policy.decide(&s.scenario), Decision::Run);
        }
    }

    #[test]
    fn without_perturbations_strace_is_needed_only_where_ebpf_cannot_record() {
        let s = scenario("tcp-close-during-recv");
        assert!(!s.scenario.audit.is_empty() && s.scenario.perturb.is_empty());
        let p = profile::load(&repo("hosts/local.yaml")).unwrap();
        let mut f = bare();
        f.strace = false;
        f.ebpf_absent = None;
        let mut facts = [f];
        let decide = |facts: &[HostFacts]| {
            Policy {
                profile: &p,
                facts,
                strict: false,
                strikes: Strikes::default(),
                no_audit: false,
            }
            .decide(&s.scenario)
        };
        assert_eq!(decide(&facts), Decision::Run);
        facts[0].ebpf_absent = Some("loading BPF programs needs root".into());
        let Decision::Skip(why) = decide(&facts) else {
            panic!("expected a skip")
        };
        assert_eq!(why.code, SkipCode::NoStrace, "{why}");
        assert!(why.detail.contains("where eBPF cannot"), "{why}");
    }

    #[test]
    fn a_host_level_fault_without_host_control_is_skipped() {
        let s = scenario("tcp-xhost-peer-host-death");
        assert!(s
            .scenario
            .faults
            .iter()
            .any(|f| f.value.action.is_host_level()));
        let p = profile::load(&repo("hosts/containers.yaml")).unwrap();
        let mut a = bare();
        a.host = "a".into();
        let mut b = bare();
        b.host = "b".into();
        let facts = [a, b];
        let mut policy = Policy {
            profile: &p,
            facts: &facts,
            strict: false,
            strikes: Strikes::default(),
            no_audit: false,
        };
        let Decision::Skip(why) = policy.decide(&s.scenario) else {
            panic!("expected a skip")
        };
        assert_eq!(why.code, SkipCode::NoHostControl, "{why}");
        policy.strikes.host = true;
        assert_eq!(policy.decide(&s.scenario), Decision::Run);
    }

    #[test]
    fn a_wire_fault_needs_the_vm_pair_and_host_control_is_not_enough() {
        let s = steps::parse(
            Path::new("wire.yaml"),
            "name: wire\ndescription: a wire fault on an exec role\nranks: 2\ndeadline: 60s\nsteps:\n  - exec:\n      deadline: 30s\n      roles:\n        a: { ranks: [0, 1], program: \"true\" }\n      faults:\n        - { role: a, rank: 1, action: roce-blackhole, at: started }\nexpect:\n  exit_ms: { max: 1000 }\n",
        )
        .unwrap();
        let p = profile::load(&repo("hosts/rxe-vm-pair.yaml")).unwrap();
        assert!(p.strikes().wire);
        let facts = [bare()];
        let mut policy = Policy {
            profile: &p,
            facts: &facts,
            strict: false,
            strikes: Strikes {
                host: true,
                wire: false,
            },
            no_audit: true,
        };
        let Decision::Skip(why) = policy.decide(&s.scenario) else {
            panic!("expected a skip")
        };
        assert_eq!(why.code, SkipCode::NoWireControl, "{why}");
        assert!(why.detail.contains("rxe-vm-pair"), "{why}");
        policy.strikes.wire = true;
        assert_eq!(policy.decide(&s.scenario), Decision::Run);
    }

    #[test]
    fn a_vm_that_cannot_run_here_is_a_skip_or_a_must_have_failure() {
        let reason = || SkipReason {
            code: SkipCode::NoVm,
            detail: "virtme-ng is not installed".into(),
        };
        let local = profile::load(&repo("hosts/local.yaml")).unwrap();
        let rxe_vm = profile::load(&repo("hosts/rxe-vm.yaml")).unwrap();
        let facts = [bare()];
        let policy = |p| Policy {
            profile: p,
            facts: &facts,
            strict: false,
            strikes: Strikes::default(),
            no_audit: false,
        };
        let rdma = [Requirement::Rdma];
        assert!(matches!(
            policy(&local).unmet(reason(), &rdma),
            Decision::Skip(_)
        ));
        assert!(matches!(
            policy(&rxe_vm).unmet(reason(), &rdma),
            Decision::Fail(_)
        ));
        let not_run = policy(&local)
            .unmet(reason(), &rdma)
            .result("s", Path::new("s.yaml"))
            .unwrap();
        assert_eq!(not_run.verdict, crate::model::result::Verdict::Skip);
        assert_eq!(not_run.skip.unwrap().code, SkipCode::NoVm);
        assert_eq!(
            not_run.reason.as_deref(),
            Some("no-vm: virtme-ng is not installed")
        );
    }
}

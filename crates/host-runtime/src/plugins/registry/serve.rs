//! Serving a backend: which verified candidate serves it, in this process or in a worker
//! ([`Registry::served`], the one place that decides), and why the others do not.

use std::sync::Arc;

use delegate_abi::host::Plugin;
use delegate_abi::PluginInfo;

use super::{Candidate, Registry, Status};
use crate::plugins::isolate::IsolatedPlugin;

/// How the plugin serving a backend runs: loaded into this process, or in worker processes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Served {
    /// Loaded here; calls are direct.
    InProcess(Arc<Plugin>),
    /// Never loaded here: each instance runs in a worker process (see `crate::isolate`, Linux only; elsewhere
    /// [`IsolatedPlugin`] is uninhabited, so this variant never occurs).
    Isolated(IsolatedPlugin),
}

impl Served {
    /// What the plugin says it is (an isolated one: what its manifest says).
    pub fn info(&self) -> &PluginInfo {
        match self {
            Served::InProcess(plugin) => plugin.info(),
            Served::Isolated(plugin) => plugin.info(),
        }
    }

    /// The plugin, when it runs in this process; `None` when it runs in a worker.
    pub fn in_process(&self) -> Option<&Arc<Plugin>> {
        match self {
            Served::InProcess(plugin) => Some(plugin),
            Served::Isolated(_) => None,
        }
    }

    /// Whether it runs in a worker process.
    pub fn is_isolated(&self) -> bool {
        self.in_process().is_none()
    }
}

impl Registry {
    /// How the plugin serving `backend` runs — the one decision every path that runs a program (TOML, `.pte`,
    /// the ExecuTorch bridge, the library API) takes here: [`Served::Isolated`] for a listed plugin that the
    /// isolation settings cover (its library is not loaded here), otherwise the plugin loaded into this
    /// process (a listed one now, once, verified against its manifest). The verified candidates are tried best
    /// first; one that cannot serve is passed over (one log line) and [`Registry::unavailable_for`] says why.
    /// A plugin whose manifest asks for isolation is never loaded into a host without isolation settings.
    pub fn served(&self, backend: &str) -> Option<Served> {
        self.serving.get(backend)?.iter().find_map(|&index| self.try_serve(&self.candidates[index]))
    }

    /// The plugin serving `backend` in this process, if any: release 0.1.0's name for
    /// `served(backend)?.in_process()`, kept one release for code written against it (a plugin served in a
    /// worker process is `None` here).
    #[deprecated(
        since = "0.2.0",
        note = "use `Registry::served`, which also says when a worker process serves it"
    )]
    pub fn for_backend(&self, backend: &str) -> Option<Arc<Plugin>> {
        self.served(backend)?.in_process().cloned()
    }

    /// `candidate` serving, or `None` (the reason recorded) when it cannot.
    fn try_serve(&self, candidate: &Candidate) -> Option<Served> {
        if candidate.failed() {
            return None;
        }
        match self.placement(candidate) {
            Placement::Isolated => self.isolated(candidate),
            Placement::Refused(reason) => {
                candidate.refuse_listed(reason);
                None
            }
            Placement::InProcess if candidate.is_lazy() => {
                candidate.load_listed(&self.config).map(Served::InProcess)
            }
            Placement::InProcess => candidate.plugin.clone().map(Served::InProcess),
        }
    }

    fn isolated(&self, candidate: &Candidate) -> Option<Served> {
        let (Some(isolation), Some(path), Some(info)) = (&self.isolation, &candidate.path, &candidate.info)
        else {
            return None;
        };
        Some(Served::Isolated(IsolatedPlugin::new(path.clone(), info.clone(), isolation.clone())))
    }

    /// Where `candidate` runs under this registry's isolation settings.
    fn placement(&self, candidate: &Candidate) -> Placement {
        let asks = candidate.manifest.as_ref().is_some_and(|m| m.isolate);
        let isolation = self.isolation.as_ref().map(|i| i.applies(asks));
        match (candidate.is_lazy(), &candidate.path, isolation) {
            // Embedded plugins are our own code: always here.
            (_, None, _) => Placement::InProcess,
            (true, Some(_), Some(true)) => Placement::Isolated,
            (true, Some(_), None) if asks => {
                Placement::Refused("its manifest asks to run it in a worker process, and this host runs none")
            }
            (true, Some(_), _) => Placement::InProcess,
            // Loaded into this process by a probe.
            (false, Some(_), Some(true)) => Placement::Refused(
                "a probe loaded it into this process, so it cannot run isolated (probing and isolating every \
                 plugin exclude each other)",
            ),
            _ => Placement::InProcess,
        }
    }

    /// Whether `candidate` runs in a worker process under this registry's isolation settings.
    pub fn runs_isolated(&self, candidate: &Candidate) -> bool {
        matches!(self.placement(candidate), Placement::Isolated)
    }

    /// Plugins that offer `backend` but cannot serve it — those that said they cannot run on this machine,
    /// listed ones that failed to load, disagreed with their manifest or must run isolated, libraries whose
    /// bytes differ from their manifest: (plugin name, the reason). Libraries without a manifest, which may
    /// offer any backend, are [`Registry::without_manifest`].
    pub fn unavailable_for<'r>(&'r self, backend: &'r str) -> impl Iterator<Item = (String, String)> + 'r {
        self.candidates.iter().filter_map(move |c| {
            let info = c.info.as_ref().filter(|info| info.backends.iter().any(|b| b == backend))?;
            let reason = match (&c.status, c.load_failure()) {
                (Status::Unavailable(reason), _) => reason,
                (Status::Rejected(reason), _) if c.manifest.is_some() => reason,
                (_, Some(reason)) => reason,
                _ => return None,
            };
            Some((info.name.clone(), reason.to_owned()))
        })
    }

    /// Libraries found without a manifest: never opened, so what they serve is unknown; each may offer a
    /// backend nobody serves (`delegate-host plugin-manifest LIB` writes one).
    pub fn without_manifest(&self) -> impl Iterator<Item = &std::path::Path> + '_ {
        self.candidates.iter().filter(|c| c.status == Status::NoManifest).filter_map(|c| c.path.as_deref())
    }

    /// The candidate serving `backend` now: the best verified one that has not failed to serve. Loads
    /// nothing (a listed candidate not asked for yet is taken to serve).
    pub fn candidate_for_backend(&self, backend: &str) -> Option<&Candidate> {
        let order = self.serving.get(backend)?;
        order.iter().map(|&i| &self.candidates[i]).find(|c| !c.failed())
    }

    /// Why [`Registry::candidate_for_backend`] serves `backend`, one phrase: the only candidate, the highest
    /// version, the first found among equal versions, and any better candidate passed over with its reason.
    pub fn why_serves(&self, backend: &str) -> Option<String> {
        let order: Vec<&Candidate> =
            self.serving.get(backend)?.iter().map(|&i| &self.candidates[i]).collect();
        let at = order.iter().position(|c| !c.failed())?;
        let winner = order[at];
        let version = winner.version().map_or_else(|| "?".to_owned(), |v| v.to_string());
        let rest = &order[at + 1..];
        let mut why = match rest.first() {
            None if at == 0 => "the only verified candidate that offers it".to_owned(),
            None => "the last verified candidate that offers it".to_owned(),
            Some(next) if next.version() < winner.version() => {
                format!("the highest version ({version}) of {} verified candidates", rest.len() + 1)
            }
            Some(_) => format!("found first of the verified candidates at version {version}"),
        };
        for passed in &order[..at] {
            let reason = passed.load_failure().unwrap_or("failed");
            why.push_str(&format!("; {} was passed over: {reason}", passed.location()));
        }
        Some(why)
    }

    /// Every backend id served, sorted (a backend whose every candidate failed to serve is not).
    pub fn backends(&self) -> Vec<String> {
        self.serving.keys().filter(|b| self.candidate_for_backend(b).is_some()).cloned().collect()
    }
}

/// Where a candidate runs.
enum Placement {
    InProcess,
    Isolated,
    Refused(&'static str),
}

//! An engine described by data, as `trt-exec` or the reference delegate would report a real one (arbitrary
//! and possibly inconsistent in the property tests: a buggy engine library must not panic us).

use alias_validate::{EngineIntrospect, EngineTensor};

/// The tensors an engine reports, the aliases it reports (output, input), and whether it can report them.
#[derive(Debug, Clone)]
pub struct DataEngine {
    pub tensors: Vec<EngineTensor>,
    pub aliases: Vec<(String, String)>,
    pub reports_aliases: bool,
}

impl EngineIntrospect for DataEngine {
    fn tensors(&self) -> Vec<EngineTensor> {
        self.tensors.clone()
    }

    fn reports_aliases(&self) -> bool {
        self.reports_aliases
    }

    fn aliased_input(&self, output: &str) -> Option<String> {
        self.aliases.iter().find(|(o, _)| o == output).map(|(_, input)| input.clone())
    }
}

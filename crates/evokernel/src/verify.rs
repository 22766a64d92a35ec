//! Correctness gates: every implementation is checked against the f64 oracle on fresh
//! seeded inputs with its output poisoned first (MEASURE.md).

use serde::{Deserialize, Serialize};

use crate::backend::{ConvRun, ProblemData};
use crate::epilogue::epilogue_reference;
use crate::error::Result;
use crate::pass::Pass;
use crate::reference::{bias_grad_reference, conv_reference, dgrad_reference, wgrad_reference};
use crate::tensor::{compare, Comparison};

/// The oracle's output for set 0 of a problem.
pub fn oracle(problem: &ProblemData) -> Result<Vec<f64>> {
    let spec = &problem.spec;
    match problem.pass {
        Pass::Forward => {}
        Pass::Dgrad => return dgrad_reference(spec, &problem.grad_outputs[0], &problem.weight),
        Pass::Wgrad => {
            let gy = &problem.grad_outputs[0];
            let mut g = wgrad_reference(spec, &problem.inputs[0], gy)?;
            if problem.epilogue.bias {
                g.extend(bias_grad_reference(spec, gy)?);
            }
            return Ok(g);
        }
    }
    let mut y = conv_reference(&problem.spec, &problem.inputs[0], &problem.weight)?;
    epilogue_reference(
        &problem.spec,
        &problem.epilogue,
        &mut y,
        problem.bias.as_ref(),
        problem.residual(0),
    )?;
    Ok(y)
}

/// The result of one check.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Verdict {
    pub comparison: Comparison,
    pub passed: bool,
    /// The rel-L2 gate applied (by dtype).
    pub gate: f64,
}

/// Poisons, launches once on set 0, and compares with the oracle.
pub fn check(run: &mut dyn ConvRun, problem: &ProblemData, reference: &[f64]) -> Result<Verdict> {
    run.poison(0)?;
    run.launch(0)?;
    let y = run.output(0)?;
    let comparison = compare(&y, reference)?;
    let dtype = problem.spec.dtype();
    Ok(Verdict {
        passed: comparison.passes(dtype),
        gate: dtype.rel_l2_gate(),
        comparison,
    })
}

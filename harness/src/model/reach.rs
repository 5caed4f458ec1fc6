//! Reachability: the points a step kind's purpose depends on (a receiver blocked when the
//! close came, a recv deadline expiring inside a frame). A scenario names the ones it must
//! reach (`must_reach:`); one that no repeat reached fails, so a check that could not fail, or
//! a race window never entered, is never a pass.

/// A point a step kind declares, with what reaching it means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReachPoint {
    pub name: &'static str,
    pub meaning: &'static str,
}

/// `crate::reach_points! { pub NAME = "name", "what reaching it means"; ... }`
#[macro_export]
macro_rules! reach_points {
    ($($vis:vis $id:ident = $name:literal, $meaning:literal;)*) => {
        $($vis const $id: $crate::model::reach::ReachPoint =
            $crate::model::reach::ReachPoint { name: $name, meaning: $meaning };)*
    };
}

//! The planner's rules that need what the cluster holds: the namespace's
//! Pod Security floor.

use super::*;

/// The namespace's Pod Security level is a floor: only a namespace that
/// enforces `restricted` refuses what the permit's walk at `baseline`
/// found against `restricted`, naming itself; a configured `restricted`
/// was the permit's already (nothing stashed).
#[test]
fn the_namespace_floor_refuses_what_restricted_refuses_only_where_enforced() {
    let d = d(false);
    let ns = |enforce: Option<&str>| match enforce {
        Some(level) => {
            json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}})
        }
        None => json!({"metadata": {}}),
    };
    let found = ClusterChecks {
        pod_template: true,
        restricted: Some(Violation("runAsNonRoot must be true (x)".into())),
        outside: Vec::new(),
    };
    assert_eq!(
        pod_security_floor(&found, &d, &ns(Some("restricted"))),
        Some(Violation(
            "runAsNonRoot must be true (x) (namespace shop enforces restricted)".into()
        ))
    );
    for other in [None, Some("baseline"), Some("privileged")] {
        assert_eq!(
            pod_security_floor(&found, &d, &ns(other)),
            None,
            "{other:?}"
        );
    }
    let clean = ClusterChecks {
        restricted: None,
        ..found
    };
    assert_eq!(
        pod_security_floor(&clean, &d, &ns(Some("restricted"))),
        None
    );
}

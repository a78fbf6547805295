//! The `plan` an ack may carry (protocol.md, `command.plan.v1`), checked as
//! the Control Plane would before it shows it to a person: its shape and
//! its bounds, so that a Manager that sends anything else is told so (400).

use serde_json::Value;

/// The actions an object may have.
const ACTIONS: &[&str] = &[
    "created",
    "configured",
    "unchanged",
    "deleted",
    "absent",
    "refused",
];

/// Most objects, and most fields of one object.
const MAX: usize = 64;

/// Whether `plan` is absent (null) or a well-formed plan.
pub fn valid(plan: &Value) -> bool {
    plan.is_null() || check(plan).is_ok()
}

/// What is wrong with `plan`, if anything.
pub fn check(plan: &Value) -> Result<(), String> {
    if !plan["wouldSucceed"].is_boolean() {
        return Err("wouldSucceed is not a boolean".into());
    }
    if !plan["message"].is_string() {
        return Err("message is not a string".into());
    }
    let objects = plan["objects"].as_array().ok_or("objects is not a list")?;
    if objects.len() > MAX {
        return Err(format!("{} objects, more than {MAX}", objects.len()));
    }
    count(&plan["moreObjects"], "moreObjects")?;
    for (i, o) in objects.iter().enumerate() {
        for key in ["kind", "namespace", "name"] {
            if !o[key].is_string() {
                return Err(format!("objects[{i}].{key} is not a string"));
            }
        }
        if !o["action"].as_str().is_some_and(|a| ACTIONS.contains(&a)) {
            return Err(format!("objects[{i}].action is not one of {ACTIONS:?}"));
        }
        let fields = o["fields"]
            .as_array()
            .ok_or_else(|| format!("objects[{i}].fields is not a list"))?;
        if fields.len() > MAX {
            return Err(format!(
                "objects[{i}] names {} fields, more than {MAX}",
                fields.len()
            ));
        }
        if !fields
            .iter()
            .all(|f| f.as_str().is_some_and(|f| f.starts_with('/')))
        {
            return Err(format!(
                "objects[{i}].fields holds a value that is not a JSON pointer"
            ));
        }
        count(&o["moreFields"], &format!("objects[{i}].moreFields"))?;
        if !(o["message"].is_null() || o["message"].is_string()) {
            return Err(format!("objects[{i}].message is not a string"));
        }
    }
    Ok(())
}

fn count(v: &Value, what: &str) -> Result<(), String> {
    if v.is_null() || v.is_u64() {
        Ok(())
    } else {
        Err(format!("{what} is not a count"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plan_of_the_protocols_shape_passes_and_anything_else_is_named() {
        let good = json!({"wouldSucceed": true, "message": "would apply 1 objects (1 created)",
            "objects": [{"kind": "ConfigMap", "namespace": "shop", "name": "c", "action": "created",
                         "fields": ["/data"]}]});
        assert_eq!(check(&good), Ok(()));
        assert!(valid(&Value::Null));
        let mut bad = good.clone();
        bad["objects"][0]["action"] = json!("teleported");
        assert!(check(&bad).unwrap_err().contains("action"));
        let mut bad = good.clone();
        bad["objects"][0]["fields"] = json!(["data"]);
        assert!(check(&bad).unwrap_err().contains("JSON pointer"));
        let mut bad = good.clone();
        bad["objects"] = json!(vec![good["objects"][0].clone(); 65]);
        assert!(check(&bad).unwrap_err().contains("more than 64"));
        let mut bad = good;
        bad["wouldSucceed"] = json!("yes");
        assert!(!valid(&bad));
    }
}

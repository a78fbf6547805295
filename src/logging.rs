//! Log output: text or one JSON object a line, on stderr, filtered by `RUST_LOG`.

use std::io::Write;
use std::time::SystemTime;

use crate::config::LogFormat;

/// Installs the logger. `RUST_LOG` filters (default `info`).
pub fn init(format: LogFormat) {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    builder.format(move |buf, record| {
        let ts = humantime::format_rfc3339_seconds(SystemTime::now());
        match format {
            LogFormat::Text => {
                writeln!(
                    buf,
                    "{ts} {:<5} {}: {}",
                    record.level(),
                    record.target(),
                    record.args()
                )
            }
            LogFormat::Json => {
                let line = serde_json::json!({
                    "ts": ts.to_string(),
                    "level": record.level().as_str(),
                    "target": record.target(),
                    "msg": record.args().to_string(),
                });
                writeln!(buf, "{line}")
            }
        }
    });
    builder.init();
}

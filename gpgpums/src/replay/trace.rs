//! The published GPU-sharing trace format (Alibaba's `cluster-trace-gpu-v2023`, "openb"): a node
//! list and a pod list, as CSV with a header line. Parsed from text (the caller reads the files),
//! by column name, so any trace in that format replays, not only the copies in this repository.
//!
//! Nodes: `sn,cpu_milli,memory_mib,gpu,model`. Pods: `name,cpu_milli,memory_mib,num_gpu,gpu_milli`
//! and, where present, `gpu_spec` (allowed models, `|` between them), `qos`, `creation_time`,
//! `deletion_time` (seconds).

use std::collections::HashMap;

/// Most GPUs one node or one pod may have in a trace (the published ones have at most 8).
pub const MAX_TRACE_GPUS: u32 = 64;
/// Most lines a trace file may have.
pub const MAX_TRACE_ROWS: usize = 1_000_000;
/// A GPU's capacity in the trace's unit: thousandths of a GPU.
pub const GPU_MILLI: u32 = 1000;

/// One node of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceNode {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u32,
    pub model: String,
}

/// One pod of the trace, as the published simulator reads it: `gpu_milli` is per GPU (a whole
/// GPU is 1000; more is read as 1000), and a pod with no GPU has no share and no models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePod {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    pub gpu_milli: u32,
    /// The models it may run on; empty: any.
    pub gpu_spec: Vec<String>,
    pub qos: Option<String>,
    pub creation_time: Option<u64>,
    pub deletion_time: Option<u64>,
}

impl TracePod {
    /// Thousandths of a GPU it asks in all.
    pub fn gpu_request(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    /// One share of one GPU (not a whole one).
    pub fn is_fractional(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli > 0 && self.gpu_milli < GPU_MILLI
    }

    /// Whether `model` is one it may run on.
    pub fn allows(&self, model: &str) -> bool {
        self.gpu_spec.is_empty() || self.gpu_spec.iter().any(|m| m == model)
    }
}

/// Why a trace file cannot be read: the line (1 is the header) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct TraceError {
    pub line: usize,
    pub reason: String,
}

/// The rows of a CSV text, each a map from column name to its field.
struct Rows<'a> {
    columns: HashMap<&'a str, usize>,
    lines: Vec<(usize, Vec<&'a str>)>,
}

impl<'a> Rows<'a> {
    fn parse(text: &'a str, required: &[&str]) -> Result<Self, TraceError> {
        let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
        let Some((_, header)) = lines.next() else {
            return Err(TraceError { line: 1, reason: "empty: no header line".into() });
        };
        let mut columns = HashMap::new();
        for (i, name) in header.split(',').enumerate() {
            if columns.insert(name.trim(), i).is_some() {
                let reason = format!("column `{}` appears twice", name.trim());
                return Err(TraceError { line: 1, reason });
            }
        }
        if let Some(missing) = required.iter().find(|c| !columns.contains_key(*c)) {
            let reason = format!("no `{missing}` column (needs {})", required.join(", "));
            return Err(TraceError { line: 1, reason });
        }
        let mut rows = Vec::new();
        for (i, line) in lines {
            if rows.len() == MAX_TRACE_ROWS {
                let reason = format!("more than {MAX_TRACE_ROWS} rows");
                return Err(TraceError { line: i + 1, reason });
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if fields.len() != columns.len() {
                let reason =
                    format!("{} fields where the header has {}", fields.len(), columns.len());
                return Err(TraceError { line: i + 1, reason });
            }
            rows.push((i + 1, fields));
        }
        Ok(Rows { columns, lines: rows })
    }

    fn field(&self, row: &[&'a str], column: &str) -> Option<&'a str> {
        self.columns.get(column).map(|&i| row[i])
    }
}

/// A whole number in `column` (a trailing `.0` is allowed, as some exports write them).
fn number(line: usize, column: &str, text: &str) -> Result<u64, TraceError> {
    let digits = text.strip_suffix(".0").unwrap_or(text);
    digits.parse().map_err(|_| TraceError {
        line,
        reason: format!("{column}: `{}` is not a whole number of 0 or more", shorten(text)),
    })
}

fn shorten(text: &str) -> String {
    text.chars().take(40).collect()
}

/// The nodes of a node list.
pub fn parse_nodes(text: &str) -> Result<Vec<TraceNode>, TraceError> {
    let rows = Rows::parse(text, &["sn", "cpu_milli", "memory_mib", "gpu", "model"])?;
    let mut seen = HashMap::new();
    let mut nodes = Vec::with_capacity(rows.lines.len());
    for (line, row) in &rows.lines {
        let get = |c: &str| rows.field(row, c).expect("required above");
        let name = get("sn");
        if name.is_empty() {
            return Err(TraceError { line: *line, reason: "sn: empty".into() });
        }
        if let Some(first) = seen.insert(name, *line) {
            let reason =
                format!("node `{}` is listed twice (first on line {first})", shorten(name));
            return Err(TraceError { line: *line, reason });
        }
        let gpus = number(*line, "gpu", get("gpu"))?;
        if gpus > u64::from(MAX_TRACE_GPUS) {
            let reason = format!("gpu: {gpus} is more than {MAX_TRACE_GPUS} GPUs on one node");
            return Err(TraceError { line: *line, reason });
        }
        nodes.push(TraceNode {
            name: name.to_owned(),
            cpu_milli: number(*line, "cpu_milli", get("cpu_milli"))?,
            memory_mib: number(*line, "memory_mib", get("memory_mib"))?,
            gpus: gpus as u32,
            model: get("model").to_owned(),
        });
    }
    if nodes.is_empty() {
        return Err(TraceError { line: 2, reason: "no nodes".into() });
    }
    Ok(nodes)
}

/// The pods of a pod list.
pub fn parse_pods(text: &str) -> Result<Vec<TracePod>, TraceError> {
    let rows = Rows::parse(text, &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"])?;
    let mut pods = Vec::with_capacity(rows.lines.len());
    for (line, row) in &rows.lines {
        let get = |c: &str| rows.field(row, c);
        let required = |c: &str| get(c).expect("required above");
        let num_gpu = number(*line, "num_gpu", required("num_gpu"))?;
        if num_gpu > u64::from(MAX_TRACE_GPUS) {
            let reason = format!("num_gpu: {num_gpu} is more than {MAX_TRACE_GPUS}");
            return Err(TraceError { line: *line, reason });
        }
        let gpu_milli = number(*line, "gpu_milli", required("gpu_milli"))?;
        let (gpu_milli, gpu_spec) = if num_gpu == 0 {
            (0, Vec::new())
        } else {
            let spec = get("gpu_spec").unwrap_or("");
            let models = spec.split('|').filter(|m| !m.is_empty()).map(str::to_owned).collect();
            (gpu_milli.min(u64::from(GPU_MILLI)) as u32, models)
        };
        let optional = |c: &str| -> Result<Option<u64>, TraceError> {
            match get(c) {
                None | Some("") => Ok(None),
                Some(text) => number(*line, c, text).map(Some),
            }
        };
        pods.push(TracePod {
            name: required("name").to_owned(),
            cpu_milli: number(*line, "cpu_milli", required("cpu_milli"))?,
            memory_mib: number(*line, "memory_mib", required("memory_mib"))?,
            num_gpu: num_gpu as u32,
            gpu_milli,
            gpu_spec,
            qos: get("qos").filter(|q| !q.is_empty()).map(str::to_owned),
            creation_time: optional("creation_time")?,
            deletion_time: optional("deletion_time")?,
        });
    }
    if pods.is_empty() {
        return Err(TraceError { line: 2, reason: "no pods".into() });
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_and_pods_read_by_column_name() {
        let nodes = parse_nodes("model,sn,gpu,cpu_milli,memory_mib\nT4,n1,2,32000,1024\n").unwrap();
        assert_eq!(nodes[0].name, "n1");
        assert_eq!((nodes[0].gpus, nodes[0].cpu_milli, nodes[0].model.as_str()), (2, 32000, "T4"));
        let pods = parse_pods(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
             a,1000,10,1,460,T4|G2\nb,1000,10,0,300,T4\nc,1000,10,2,1500,\n",
        )
        .unwrap();
        assert_eq!(pods[0].gpu_spec, ["T4", "G2"]);
        assert!(pods[0].is_fractional() && pods[0].allows("G2") && !pods[0].allows("P100"));
        assert_eq!((pods[1].gpu_milli, pods[1].gpu_spec.len()), (0, 0), "no GPU: no share");
        assert_eq!((pods[2].gpu_milli, pods[2].gpu_request()), (1000, 2000), "a GPU at most");
        assert!(pods[2].allows("anything"));
    }

    #[test]
    fn bad_input_names_its_line_and_column() {
        let err = parse_pods("name,cpu_milli,memory_mib,num_gpu\n").unwrap_err();
        assert!(err.reason.contains("no `gpu_milli` column"), "{err}");
        let err = parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,x,1\n");
        assert_eq!(
            err.unwrap_err().to_string(),
            "line 2: num_gpu: `x` is not a whole number of 0 or more"
        );
        let err = parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,-1,1,1,1\n");
        assert!(err.unwrap_err().reason.starts_with("cpu_milli"));
        let err = parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1\n");
        assert_eq!(err.unwrap_err().line, 2);
        let err = parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,65,1000\n");
        assert!(err.unwrap_err().reason.contains("more than 64"));
        let err = parse_nodes("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T4\nn,1,1,1,T4\n");
        assert!(err.unwrap_err().reason.contains("listed twice (first on line 2)"));
        assert!(parse_nodes("").is_err());
        assert!(parse_nodes("sn,cpu_milli,memory_mib,gpu,model\n").is_err(), "no nodes");
        let err = parse_nodes("sn,sn,cpu_milli,memory_mib,gpu,model\n").unwrap_err();
        assert!(err.reason.contains("appears twice"));
    }
}

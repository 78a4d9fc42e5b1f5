//! NVML discovery and the health watch, end to end on a machine without a GPU: the agent binary
//! loads a stand-in `libnvidia-ml.so.1` (`tests/fake-nvml/fake_nvml.c`, built here with the
//! system's C compiler) through the real `nvml-wrapper`, as it would NVIDIA's, and prints what it
//! found (`rodvr-agent gpus`, what `scripts/gpu-check.sh` runs on a real GPU).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the stand-in library into a fresh directory; the directory.
fn fake_nvml() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("gsaas-fake-nvml-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-nvml/fake_nvml.c");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join("libnvidia-ml.so.1"))
        .arg(&source)
        .status()
        .expect("a C compiler (cc)");
    assert!(status.success(), "building the stand-in NVML failed");
    dir
}

/// `rodvr-agent gpus` with the stand-in NVML describing `gpus`: its output.
fn agent_gpus(lib: &Path, gpus: &str, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rodvr-agent"))
        .arg("gpus")
        .args(extra)
        .env("LD_LIBRARY_PATH", lib)
        .env("FAKE_NVML_GPUS", gpus)
        .env("FAKE_NVML_CUDA", "12080")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn nvml_discovery_and_health_through_the_real_wrapper() {
    let lib = fake_nvml();
    let gpus = [
        // A healthy H100, an A100 in MIG mode with two instances, a GPU with uncorrectable ECC
        // errors, one with pages waiting to retire, one that raised XID 79.
        "NVIDIA H100 80GB HBM3:81559:9.0:GPU-11111111:0:0:0:0:0",
        "NVIDIA A100-SXM4-40GB:40960:8.0:GPU-22222222:2:0:0:0:0",
        "Tesla T4:15360:7.5:GPU-33333333:0:2:0:0:0",
        "Tesla T4:15360:7.5:GPU-44444444:0:0:1:0:0",
        "Tesla T4:15360:7.5:GPU-55555555:0:0:0:79:0",
    ]
    .join(";");
    let out = agent_gpus(&lib, &gpus, &["--watch-secs", "1"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "discovery: NVML, driver fake-nvml (GSaaS tests)", "{out}");
    assert_eq!(
        lines[1],
        "GPU 0: NVIDIA H100 80GB HBM3 | 81559 MiB | compute capability 9.0 | CUDA 12.8 | \
         GPU-11111111 | MIG off | healthy",
        "{out}"
    );
    assert!(
        lines[2].starts_with("GPU 1: NVIDIA A100-SXM4-40GB | 40960 MiB")
            && lines[2].contains("MIG on"),
        "{out}"
    );
    // Its instances: partitions numbered past the whole GPUs, named by NVML, with a profile.
    let partitions: Vec<&&str> = lines.iter().filter(|l| l.contains("partition")).collect();
    assert_eq!(partitions.len(), 2, "{out}");
    assert!(
        partitions[0].starts_with("GPU 200: NVIDIA A100-SXM4-40GB MIG 1g.13gb | 13653 MiB"),
        "{out}"
    );
    assert!(
        partitions[0].contains("MIG-0-GPU-22222222 | partition 1g.13gb of GPU 1 | healthy"),
        "{out}"
    );
    let health = |index: u32| {
        let prefix = format!("GPU {index}: ");
        let line = lines.iter().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{out}"));
        line.rsplit(" | ").next().unwrap().to_owned()
    };
    assert_eq!(health(2), "unhealthy: 2 uncorrectable ECC errors since the driver loaded");
    assert_eq!(health(3), "unhealthy: memory pages wait to be retired (the GPU needs a reset)");
    assert_eq!(health(4), "unhealthy: critical XID error 79");

    // A GPU fallen off the bus: discovery cannot read it, and says so rather than guessing.
    let lost = "Tesla T4:15360:7.5:GPU-66666666:0:0:0:0:1";
    let out = Command::new(env!("CARGO_BIN_EXE_rodvr-agent"))
        .args(["gpus", "--watch-secs", "0"])
        .env("LD_LIBRARY_PATH", &lib)
        .env("FAKE_NVML_GPUS", lost)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("GPU discovery failed"), "{out:?}");

    // Without the library: the config's GPUs, named as such.
    let out = Command::new(env!("CARGO_BIN_EXE_rodvr-agent"))
        .args(["gpus", "--watch-secs", "0"])
        .env("LD_LIBRARY_PATH", std::env::temp_dir().join("no-such-dir"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("discovery: the config's GPUs") && text.contains("no GPU found"),
        "{text}"
    );
    std::fs::remove_dir_all(&lib).unwrap();
}

/// What the managed servers' memory watch reads: the GPU memory each process holds, summed over
/// the GPUs, as the driver counts it (`nvmlDeviceGetComputeRunningProcesses`).
#[test]
fn the_gpu_memory_each_process_holds_is_read_through_nvml() {
    let lib = fake_nvml();
    let processes = lib.join("processes");
    // Process 4242 on both GPUs, 77 on the second only.
    std::fs::write(&processes, "0 4242 1024\n1 4242 512\n1 77 300\n").unwrap();
    let gpus = "NVIDIA H200:143771:9.0:GPU-a:0:0:0:0:0;NVIDIA H200:143771:9.0:GPU-b:0:0:0:0:0";
    let out = Command::new(env!("CARGO_BIN_EXE_rodvr-agent"))
        .args(["gpus", "--watch-secs", "0"])
        .env("LD_LIBRARY_PATH", &lib)
        .env("FAKE_NVML_GPUS", gpus)
        .env("FAKE_NVML_PROCESSES_FILE", &processes)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let held: Vec<&str> = text.lines().filter(|l| l.starts_with("process ")).collect();
    assert_eq!(
        held,
        ["process 77: 300 MiB of GPU memory", "process 4242: 1536 MiB of GPU memory"],
        "{text}"
    );
    std::fs::remove_dir_all(&lib).unwrap();
}

# Sourced by the benchmark templates: where results go and how they are stored.
#   SLURMHEALTH_BIN   the slurmhealth executable (default: slurmhealth on PATH)
#   RESULTS_DIR       where raw tool outputs are kept (default: $HOME/slurmhealth-results)
#   GPU_MODEL         stored with the results (default: what nvidia-smi says, else "unknown")
SH=${SLURMHEALTH_BIN:-slurmhealth}
RESULTS_DIR=${RESULTS_DIR:-$HOME/slurmhealth-results}
mkdir -p "$RESULTS_DIR"
if [ -z "${GPU_MODEL:-}" ]; then
    GPU_MODEL=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 || true)
    GPU_MODEL=${GPU_MODEL:-unknown}
fi

# ingest KIND FILE NODE LABEL: store the results; a tool that reported errors fails the job
ingest() {
    "$SH" baseline ingest "$1" "$2" --node "$3" --gpu-model "$GPU_MODEL" --label "$4"
}

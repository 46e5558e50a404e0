"""Where a Kokoro row's numbers came from: every row carries `where` and `target` from the runner
that produced its numbers (OrtRunner and the torch generator: fp32, the simulator: simulator, a
BuildReport: host), so a notebook never types them."""

FP32 = {"where": "fp32", "target": "none"}


def origin(runner) -> dict:
    return {"where": runner.where, "target": runner.target}

"""The Kokoro generator's measurements (host), in one namespace for notebook 03 (`study as ks`).

Each lives in the module of its notebook section: recovery (1-2, the weights and the seam),
rewrite_checks (3, the rewrites and the Snake sine), producer_gates (4), compiler (5, the probes and
the REGTASK sweep, the in-graph window's pieces), fp16_range (6), walks (7 and 9, fp32 and simulator
walks), global_statistics (8), planning (the window planner's target), overflow (notebook 08's int16
rows), quantization (notebook 08's quantization stage). Every row carries `where` and `target` from
the runner that made its numbers (rows.py).
"""

from .compiler_sweep import (  # noqa: F401
    PROBES,
    QUICK_PROBES,
    SweepBuild,
    build_row,
    in_graph_pieces,
    sweep,
    toolkit_probes,
)
from .global_statistics import (  # noqa: F401
    fed_stats_graph,
    fed_stats_walk,
    global_statistics,
    global_statistics_simulator,
    torch_walk,
)
from .node_ranges import FP16_MAX, node_maxima, range_summary  # noqa: F401
from .planning import PLAN_CONTEXTS, Seam, known_builds, plan_target  # noqa: F401
from .producer_gates import census_row, export_gate_rows, padded_window_rows  # noqa: F401
from .quantization import (  # noqa: F401
    QUANT_CALIBRATION_UTTERANCES,
    QUANT_EVALUATION_UTTERANCES,
    quantization_stage,
)
from .recovery import frontend_rows, int8_floor, versus_int8, weights_row  # noqa: F401
from .rewrite_checks import (  # noqa: F401
    REWRITE_SETS,
    SineStats,
    rewrite_rows,
    sine_arguments,
    sine_fit_rows,
    sine_rows,
    weight_norm_rows,
)
from .walks import (  # noqa: F401
    OVERLAP,
    full_decode,
    loudness,
    short_utterance_rows,
    sidecar,
    simulator_walk_rows,
    walk_feeds,
    walk_gen,
    window_loudness,
)

"""The compiler path (host): rknn-toolkit2, the host compiler and its PC simulator, driven from this process.

The toolkit imports torch and onnx, crashes on some graphs and prints its diagnostics straight to its
file descriptors, so every build and simulator run happens in a child process, and everything else here
reads what that child reports:

    build         a build in a child and its report (REGTASK lines counted, killed past a limit or a timeout)
    _child        the child's own side: config, load, build, export, and a simulator it keeps serving
    forkserver    how a child starts: forked from a server that imported the toolkit once, or exec'd
    envs          which toolkit builds: the one installed here or another version's environment
    calibration   what a quantized build is: calibration feeds and the quantizer's settings
    engine_cache  an engine's content key, its path in the cache, and the key its file name carries
    simulator     the simulator as a Runner, a quantization session, one-shot simulations
    convert       stage 2 for every family, and the simulator against fp32
    log           what the toolkit prints, read anywhere (REGTASK, layer table, memory plan, accuracy)
    macs          which compiled layer computes which ONNX conv, and its multiply-accumulates
    probes        the small probe graphs the studies build
"""

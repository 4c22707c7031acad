"""The supervisor's hand-off to the programs it starts (batchgen_site/supervisor.py):
the variable naming the file a program writes its last words to before it exits with
EX_CONFIG (inference/runtime.py), as Kubernetes reads a terminationMessagePath."""

TERMINATION_LOG_ENV = "BATCHGEN_TERMINATION_LOG"

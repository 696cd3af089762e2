"""Sources feed the run model: verl JSONL files, console logs, HTTP push (and, in their own packages,
NVML and Ray discovery). Each reports ``omniwatch_source_up{source,target}`` and counts its skips."""

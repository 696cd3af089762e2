"""Sources feed the run model: verl JSONL files and console logs (file tails). HTTP push is a router
(``push.py``); NVML and Ray discovery live in their own packages. Each reports
``omniwatch_source_up{source,target}`` and counts its skips. A source never imports the web layer."""

cd /work/main
P=/work/main/.venv/bin/python
PROBE_LABEL=default PROBE_PROFILE=1 $P /work/runs/kernel/probe.py
PROBE_LABEL=no-mkldnn PROBE_NO_MKLDNN=1 PROBE_PROFILE=1 $P /work/runs/kernel/probe.py
PROBE_LABEL=aten-avx2 ATEN_CPU_CAPABILITY=avx2 PROBE_PROFILE=1 $P /work/runs/kernel/probe.py
PROBE_LABEL=onednn-avx2 ONEDNN_MAX_CPU_ISA=AVX2 $P /work/runs/kernel/probe.py
PROBE_LABEL=both-avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $P /work/runs/kernel/probe.py
PROBE_LABEL=default-again $P /work/runs/kernel/probe.py

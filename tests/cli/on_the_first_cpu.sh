#!/bin/sh
# on_the_first_cpu.sh COMMAND [ARGS...]: runs COMMAND on the first CPU of this
# process' affinity alone, with WRITESCOPE_GPU_DRIVER_CPU naming that CPU.
cpu=$(taskset -pc $$ | sed -e 's/.*: //' -e 's/[,-].*//')
WRITESCOPE_GPU_DRIVER_CPU=$cpu exec taskset -c "$cpu" "$@"

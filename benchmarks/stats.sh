# Shared by the comparison scripts (source it): statistics over repeated runs and the machine's
# description, so every figure is reported as min / median / max beside the load it ran under.

# min / median / max of the numbers on stdin (3 decimals)
stats() { sort -g | awk '{v[NR]=$1} END {printf "%.3f / %.3f / %.3f", v[1], v[int((NR+1)/2)], v[NR]}'; }
# the median of the numbers on stdin
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
# a / b with 3 decimals
ratio() { echo "$1 $2" | awk '{printf "%.3f", $1 / $2}'; }
# one line: cores, CPU model, memory
machine() {
  echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "$(free -g | awk '/Mem:/ {print $2}') GB"
}
# the 1-minute load average
load1() { cut -d' ' -f1 /proc/loadavg; }

#!/bin/sh
# Removes the lab's own leftover cgroups (sandboxd-templatelab-*), deepest
# first, only where no process is left in them.
for h in /sys/fs/cgroup/*; do
  [ -d "$h" ] || continue
  for top in "$h"/sandboxd-templatelab-* "$h"/*/*/sandboxd-templatelab-*; do
    [ -d "$top" ] || continue
    find "$top" -depth -type d | while read -r d; do
      if [ -z "$(cat "$d/cgroup.procs" 2>/dev/null)" ]; then rmdir "$d" 2>/dev/null || echo "kept $d"; else echo "busy $d"; fi
    done
  done
done

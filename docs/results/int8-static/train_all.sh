#!/bin/bash
cd /tmp/wt-int8
for s in 100 101 102 103 104 105 106 107 108 109; do
  .venv/bin/meshdl data generate --seed $s --out /tmp/int8runs/full/seed$s.npz --force > /dev/null 2>&1
  .venv/bin/meshdl train --mode central --pool global --data /tmp/int8runs/full/seed$s.npz --out /tmp/int8runs/m$s --force > /tmp/int8runs/m$s.log 2>&1
  echo "seed $s done $(date -u +%T)" >> /tmp/int8runs/train_all.log
done

#!/bin/bash
# Per data seed: the model trained on it (training seed 0, default global recipe, scales
# calibrated at the end of training: each layer's max on its 40,800 training maps),
# evaluated on its own test split, float32 and the central int8 emulation.
cd /tmp/wt-int8
for s in 100 101 102 103 104 105 106 107 108 109; do
  f=$(.venv/bin/meshdl evaluate /tmp/int8runs/m$s/model.npz /tmp/int8runs/full/seed$s.npz --json | python3 -c "import json,sys; print(json.load(sys.stdin)['accuracy'])")
  q=$(.venv/bin/meshdl evaluate /tmp/int8runs/m$s/model.npz /tmp/int8runs/full/seed$s.npz --int8-static --json | python3 -c "import json,sys; print(json.load(sys.stdin)['accuracy'])")
  echo "$s $f $q"
done

#!/usr/bin/env bash
# Where a large scene's samples go (issue 25 item 0): the built-in aerial city with contraction and
# appearance, 1 process, a fixed number of steps; the same seed and schedule in every cell:
#   before      one marching pass over the whole ray in training (model.train_round_steps=0: the old path)
#   rounds      training marches in rounds and stops each ray at its termination point (opt-in)
#   dist001     rounds + mip-NeRF 360's distortion loss, weight 0.01
#   dist01      rounds + distortion loss, weight 0.1
#   floor       rays end where they go below the box's floor (model.min_altitude=-0.5: under the ground
#               nothing is visible; without it, 63% of the samples and 65% of the weight lay behind the box)
#   shellfloor  floor + every marching step starts at opacity alpha_init in the contracted shell too
#               (model.shell_alpha_init=true: the shell's steps otherwise start r^2 times as opaque)
#   floorrand   floor + a random background colour per training ray (model.random_background=true: the
#               capture is opaque, so light a ray does not absorb must not fit)
#   aerial      floor + shell_alpha_init + random_background
#   prune       at the grid's final stage cells below opacity 0.01 per step are empty (model.occupancy_threshold_final:
#               the coarse stages' fog in free air pruned once the surfaces have formed)
#   floorprune  floor + prune;  floorprune03: floor + prune at opacity 0.03
#   footprintprune  floorprune with the floor only above the box's footprint (model.floor_footprint=true: rays
#               reaching the floor past the box's edge go on into the contracted shell, which paints the ground
#               there; 13% of city_small's training rays and 17% of its test rays reach the floor outside the box)
#   opaquefloorprune  floorprune with an opaque floor (model.opaque_floor=true: the light a ray has left at the
#               floor takes the colour field's value there, not the background's)
#   [CELLS="before rounds ..."] [NPROC=W STRATEGY="strategy=..."] bench/samples/march.sh STEPS NAME [hydra overrides...]
# e.g. OMP_NUM_THREADS=2 ../shared/tools/quiet -- bench/samples/march.sh 300 march_city_small dataset.kind=city_small
# STRATEGY (default strategy=ddp) runs the cells under another strategy, on NPROC ranks (default 1; more: torchrun,
# gloo on the CPU), e.g. the opaque floor under ss (issue 51), 2 ranks of one thread each:
#   CELLS="before opaquefloorprune02" NPROC=2 STRATEGY="strategy=ss strategy.training=joint" OMP_NUM_THREADS=1 \
#     ../shared/tools/quiet -- bench/samples/march.sh 200 march_city_small_ss_joint device=cpu dataset.kind=city_small ...
# copies each run's metrics.json / metrics.jsonl to bench/samples/results/NAME/CELL/ with a meta.json entry (command,
# date, commit, load before/after, wall seconds); bench/tables.py summarises (samples per ray, rays/s,
# test PSNR at the last step).
set -euo pipefail
. "$(dirname "$0")/../record.sh"  # run_and_record
steps="$1"; name="$2"; shift 2
res="${BENCHMARKS_RESULTS:-bench/samples/results}/$name"
mkdir -p runs/bench "$res"
declare -A CELL=(
  [before]="model.train_round_steps=0"
  [rounds]="model.train_round_steps=64"
  [dist001]="model.train_round_steps=64 model.distortion_loss_weight=0.01"
  [dist01]="model.train_round_steps=64 model.distortion_loss_weight=0.1"
  [floor]="model.train_round_steps=0 model.min_altitude=-0.5"
  [shellfloor]="model.train_round_steps=0 model.min_altitude=-0.5 model.shell_alpha_init=true"
  [floorrand]="model.train_round_steps=0 model.min_altitude=-0.5 model.random_background=true"
  [aerial]="model.train_round_steps=0 model.min_altitude=-0.5 model.shell_alpha_init=true model.random_background=true"
  [prune]="model.train_round_steps=0 model.occupancy_threshold_final=0.01"
  [floorprune]="model.train_round_steps=0 model.min_altitude=-0.5 model.occupancy_threshold_final=0.01"
  [floorprune03]="model.train_round_steps=0 model.min_altitude=-0.5 model.occupancy_threshold_final=0.03"
  [footprintprune]="model.train_round_steps=0 model.min_altitude=-0.5 model.floor_footprint=true model.occupancy_threshold_final=0.01"
  [opaquefloorprune]="model.train_round_steps=0 model.min_altitude=-0.5 model.opaque_floor=true model.occupancy_threshold_final=0.01"
  [opaquefloorprune02]="model.train_round_steps=0 model.min_altitude=-0.5 model.opaque_floor=true model.occupancy_threshold_final=0.02"
  [opaquefloorprune03]="model.train_round_steps=0 model.min_altitude=-0.5 model.opaque_floor=true model.occupancy_threshold_final=0.03"
)
read -r -a strategy <<< "${STRATEGY:-strategy=ddp}"
launch=(python -m distnerf.train)
[ "${NPROC:-1}" -gt 1 ] && launch=(torchrun --standalone --nproc_per_node="$NPROC" -m distnerf.train)
for cell in ${CELLS:-before rounds dist001 dist01}; do
  out="runs/bench/${name}_${cell}"
  read -r -a overrides <<< "${CELL[$cell]}"
  cmd=("${launch[@]}" dataset=synthetic dataset.kind=city "${strategy[@]}" model.contraction=mipnerf360
    model.appearance=affine "${overrides[@]}" run_dir="$out" train.max_steps="$steps" train.max_minutes=0
    monitor.progress=false monitor.log_every=25 logger.wandb.mode=disabled eval.lpips=false "$@")
  rm -rf "$out"
  run_and_record "$res" "$cell" "$out" "${cmd[@]}"
done

#!/usr/bin/env bash
# Regenerates the README's "Results" (the figure and Tables 1-4) at this project's scale.
#
#   bash scripts/make_results.sh TARGET [more targets ...]   (the targets: run it without one)
#   bash scripts/make_results.sh tables                      (every committed table from the committed results files)
#
# Resumable: every `cb-agent run` uses --resume (an interrupted target continues where it stopped),
# expert trajectories, features and concepts are cached ($CB_AGENT_CACHE, default ~/.cache/cb-agent),
# so rerunning a finished target only re-reads its results. A fresh checkout has no runs/ (not committed): each
# target first restores its results files from the committed results/*.jsonl.gz and resumes from there (FRESH=1:
# start from nothing). Runs go to $RUNS (default runs/results); tables, figure and compressed results files are
# written to results/. Every table of `cb-agent report` is written by `table NAME` from the committed
# results/*.results.jsonl.gz with the options of its line in TABLES, so each one regenerates from
# the committed files alone (the `tables` target; tests/test_results_regenerate.py diffs them).
# Environment: CB (the cb-agent executable, default `cb-agent`), RUNS, OMP_NUM_THREADS (default 1),
# ALF_PER_TYPE (ALFWorld valid_unseen games per task type of Table 1, Table 4's closed loop and the ICAL and calibration
# targets, default 5 = 30 games; 0 = all 134 in one run), ALF_BUDGET (their step budget, default 50),
# WORKERS (episodes played at once on local Ray workers: Table 1's and the improve targets' rounds; default 1; 2 on
# this 2-core machine),
# TW_GAMES (Table 3 test games per level, default 10), TW_LEVELS (default custom-1 cooking-1 custom-2 cooking-2),
# SW_TASKS (Table 2 tasks, default all 30), SW_BUDGET (their step budget, default 50), SW_FIT_CANDIDATES (cap on
# the candidate sets of the concept fit, default 64), POOL (figure: trajectories per type sampled from, default 20),
# SIZES (Table 4, default 2,5,10,20), SIZES_LOOP (Table 4's closed loop, default 5 10 20), HELDOUT (Table 4 held-out trajectories per type, default 5),
# ICAL (the ICAL target's folder of noisy inputs and memory, default runs/ical), CAL (the calibration
# target's folder, default runs/calibration), CAL_PER_TYPE (its training games per type, default 2),
# CAL_STEPS (their budget, default 20),
# CAL_TRANSITIONS (transitions labelled, default 80: 220 candidate experiences here), CAL_RECOVER
# (recovery items, default 20), ROUNDS (the improve target's rounds after round 0, default 3), ROUND_GAMES (its
# training games per level a round, default 6), ALF_ROUNDS (the improve_alfworld target's rounds, default 2),
# LABELS, FEATURES and IMPROVE_ENV (the improve_relabelled target's label source, feature blocks and environment).
# The improve target resumes from its own folder ($RUNS/improve-textworld: the rounds' concepts and episodes), not
# from the committed results file.
set -euo pipefail
cd "$(dirname "$0")/.."
CB=${CB:-cb-agent}
RUNS=${RUNS:-runs/results}
ALF_PER_TYPE=${ALF_PER_TYPE:-5}
ALF_BUDGET=${ALF_BUDGET:-50}
WORKERS=${WORKERS:-1}
TW_GAMES=${TW_GAMES:-10}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# float32 everywhere: --dtype auto picks bfloat16 on CPUs with native bf16 and results would differ by machine
COMMON=(--dtype float32)
mkdir -p results "$RUNS"

# alf_games: the valid_unseen game options for $ALF_PER_TYPE games per task type (0: all 134)
alf_games() { if [ "$ALF_PER_TYPE" -eq 0 ]; then echo --all-games; else echo --per-type "$ALF_PER_TYPE" --games 0; fi; }

# grown ARGS...: `cb-agent run ARGS` on ALFWorld valid_unseen at $ALF_BUDGET, grown one game per task type at a
# time (partial results stay balanced over the types), or all 134 games in one run when ALF_PER_TYPE=0
grown() {
  local k
  if [ "$ALF_PER_TYPE" -eq 0 ]; then
    "$CB" run --env alfworld "${COMMON[@]}" "$@" --all-games --max-steps "$ALF_BUDGET" --resume
  else
    for k in $(seq 1 "$ALF_PER_TYPE"); do
      "$CB" run --env alfworld "${COMMON[@]}" "$@" --per-type "$k" --games 0 --max-steps "$ALF_BUDGET" --resume
    done
  fi
}

# seed FILE GZ: runs/ is not committed, so a fresh checkout has nothing to resume; start FILE (a results or
# labels JSONL) from the committed GZ (what was finished so far), so the target resumes where the committed
# results stop instead of replaying them (FRESH=1: start from nothing)
seed() {
  if [ -z "${FRESH:-}" ] && [ ! -e "$1" ] && [ -e "$2" ]; then
    mkdir -p "$(dirname "$1")"
    gzip -dc "$2" > "$1.seed" && mv "$1.seed" "$1"
    echo "resuming $1 from $2 ($(wc -l < "$1") lines)" >&2
  fi
}

# seed_round0 OUT GZ [TEXT]: an improve run's round 0 is the concept of an earlier run's cb-agent: unless
# OUT/round-0/results.jsonl exists, write it (atomically) from the cb-agent episodes of GZ (those holding TEXT, when
# given), so the run resumes round 0 instead of playing it again
seed_round0() {
  [ -e "$1/round-0/results.jsonl" ] && return 0
  [ -e "$2" ] || { echo "no $2 to seed round 0 of $1 from" >&2; exit 2; }
  mkdir -p "$1/round-0"
  gzip -dc "$2" | grep '^{"schema":"cb-agent/episode-v1","agent":"cb-agent",' | grep -F -- "${3:-}" \
    > "$1/round-0/results.jsonl.seed" || true
  mv "$1/round-0/results.jsonl.seed" "$1/round-0/results.jsonl"
}

# seed_rounds OUT NAME: an improve run's rounds from the committed results/NAME.results.jsonl.gz (evaluation
# episodes), results/NAME.train.jsonl.gz and results/NAME.labelled.jsonl.gz (training episodes and their expert labels)
# and results/NAME_rounds.jsonl (its N finished rounds): unless FRESH is set, OUT already holds a rounds file or one of
# the four is missing, write rounds 0..N-1's files and what the committed files hold of round N (its training play and
# labels), atomically, by concept_round (round K's evaluation played K's concepts, its training play K-1's), then the
# rounds file; a fresh checkout then resumes where the committed run stopped instead of playing the finished rounds
# again (their features and concepts are derived again from these files, as a resumed run derives them)
seed_rounds() {
  local out=$1 name=$2 f k n played
  { [ -z "${FRESH:-}" ] && [ ! -e "$out/rounds.jsonl" ] && [ -e "results/${name}_rounds.jsonl" ]; } || return 0
  for f in results train labelled; do [ -e "results/$name.$f.jsonl.gz" ] || return 0; done
  n=$(wc -l < "results/${name}_rounds.jsonl")
  for k in $(seq 0 "$n"); do
    for f in results train labelled; do
      played=$k
      if [ "$f" != results ]; then
        [ "$k" -eq 0 ] && continue  # round 0 plays no training game
        played=$((k - 1))
      fi
      mkdir -p "$out/round-$k"
      gzip -dc "results/$name.$f.jsonl.gz" | grep -F "\"concept_round\":$played," > "$out/round-$k/$f.jsonl.seed" || true
      if [ "$k" -eq "$n" ] && [ ! -s "$out/round-$k/$f.jsonl.seed" ]; then  # round N: only what was committed
        rm "$out/round-$k/$f.jsonl.seed"
      else
        mv "$out/round-$k/$f.jsonl.seed" "$out/round-$k/$f.jsonl"
      fi
    done
    rmdir "$out/round-$k" 2>/dev/null || true
  done
  cp "results/${name}_rounds.jsonl" "$out/rounds.jsonl.seed" && mv "$out/rounds.jsonl.seed" "$out/rounds.jsonl"
  echo "resuming $out from results/$name (rounds 0-$((n - 1)) finished)" >&2
}

# TABLES: every committed table of `cb-agent report` (results/NAME.md and .png), one a line:
# "NAME: the committed results files it is reported from (results/FILE.results.jsonl.gz), then report's options"
# (--rounds: the rounds of `cb-agent improve`, results/NAME_rounds.jsonl)
TABLES='
table1_alfworld: table1_alfworld
table1_alfworld_bf16: table1_alfworld_bf16
table1_alfworld_bf16_timed: table1_alfworld_bf16_timed --paired
table1_alfworld_dtypes: table1_alfworld table1_alfworld_bf16 --paired --common-games
table1_alfworld_reflexion: table1_alfworld_reflexion --paired
table1_alfworld_with_reflexion: table1_alfworld table1_alfworld_reflexion --paired --common-games
table1_alfworld_features: table1_alfworld_features
table1_alfworld_combined: table1_alfworld table1_alfworld_features --paired
table2_scienceworld: table2_scienceworld
table3_textworld: table3_textworld
table3_textworld_lam_auto: table3_textworld table3_textworld_lam_auto --paired
improve_textworld: improve_textworld --paired
improve_alfworld: improve_alfworld --paired
improve_textworld_expert: improve_textworld_expert --paired --rounds
improve_textworld_expert_novelty: improve_textworld_expert_novelty --paired --rounds
improve_textworld_wins_novelty: improve_textworld_wins_novelty --paired --rounds
improve_alfworld_expert: improve_alfworld_expert --paired --rounds
improve_alfworld_expert_novelty: improve_alfworld_expert_novelty --paired --rounds
table4_closed_loop: table1_alfworld table4_closed_loop_k5 table4_closed_loop_k10 table4_closed_loop_k20 --paired --common-games
ical_alfworld_actions: ical_alfworld_actions
ical_alfworld_notes: ical_alfworld_notes
ical_alfworld_combined: table1_alfworld ical_alfworld_actions --paired --common-games
calibration_alfworld_causal: calibration_alfworld_causal
calibration_alfworld_calibrator: calibration_alfworld_calibrator
calibration_alfworld_histories: table1_alfworld calibration_alfworld_causal calibration_alfworld_calibrator --paired --common-games
calibration_alfworld_joint: calibration_alfworld_joint --paired
calibration_alfworld_joint_vs_table1: table1_alfworld calibration_alfworld_joint --paired --common-games
'

# table NAME: results/NAME.md and .png by `cb-agent report` on the committed results files of NAME's TABLES line
table() {
  local line word tmp files=() options=()
  line=$(printf '%s' "$TABLES" | awk -v name="$1:" '$1 == name')
  [ -n "$line" ] || { echo "no table $1 in TABLES" >&2; exit 2; }
  tmp=$(mktemp -d)
  for word in ${line#*:}; do
    case "$word" in
      --rounds) options+=(--rounds "results/$1_rounds.jsonl") ;;  # the run's round lines, committed beside
      --*) options+=("$word") ;;
      *) gzip -dc "results/$word.results.jsonl.gz" > "$tmp/$word.jsonl"; files+=("$tmp/$word.jsonl") ;;
    esac
  done
  "$CB" report "${files[@]}" "${options[@]}" --markdown "results/$1.md" --chart "results/$1.png"
  rm -rf "$tmp"
}

# finish RESULTS_JSONL NAME: the results file compressed into results/, then its table (`table NAME`)
finish() {
  gzip -nc "$1" > "results/$2.results.jsonl.gz"
  table "$2"
}

figure() {  # seed figure: t-SNE of concepts, 20 samples of 5 trajectories per ALFWorld task type
  "$CB" concepts-tsne --env alfworld "${COMMON[@]}" --pool-per-type "${POOL:-20}" --sample-size 5 --samples 20 \
    --out results/concepts_tsne.png
}

table4() {  # concept data size: held-out valid_unseen decision accuracy vs trajectories per type
  "$CB" concept-data-size --env alfworld "${COMMON[@]}" --sizes "${SIZES:-2,5,10,20}" --heldout-per-type "${HELDOUT:-5}" \
    --out results/table4_concept_data_size.json
}

table4_closed_loop() {  # Table 4's closed loop: CB-Agent on Table 1's games with concepts fitted on k
                        # trajectories per type (ReAct demonstrations stay 2; k = 2 is table1's cb-agent)
  local k out
  seed "$RUNS/alfworld/results.jsonl" results/table1_alfworld.results.jsonl.gz
  for k in ${SIZES_LOOP:-5 10 20}; do
    out="$RUNS/alfworld-concept-k$k"
    seed "$out/results.jsonl" "results/table4_closed_loop_k$k.results.jsonl.gz"
    "$CB" run --env alfworld "${COMMON[@]}" --agent cb-agent --concept-per-type "$k" $(alf_games) \
      --max-steps "$ALF_BUDGET" --out-dir "$out" --resume --workers "$WORKERS"
    gzip -nc "$out/results.jsonl" > "results/table4_closed_loop_k$k.results.jsonl.gz"
  done
  table table4_closed_loop
}

table1() {  # ALFWorld valid_unseen, budget 50; grown one game per type at a time (balanced partial
            # results), or all 134 games in one run (ALF_PER_TYPE=0, on $WORKERS Ray workers)
  seed "$RUNS/alfworld/results.jsonl" results/table1_alfworld.results.jsonl.gz
  grown --agent react --agent prior-only --agent cb-agent --out-dir "$RUNS/alfworld" --workers "$WORKERS"
  finish "$RUNS/alfworld/results.jsonl" table1_alfworld
}

table1_bf16() {  # Table 1 again in bfloat16 (this CPU's --dtype auto), all 134 games on $WORKERS workers: the
                 # other dtype's results, and the timing of the whole table (report's running time)
  seed "$RUNS/alfworld-bf16/results.jsonl" results/table1_alfworld_bf16.results.jsonl.gz
  "$CB" run --env alfworld --dtype bfloat16 --agent react --agent prior-only --agent cb-agent --all-games \
    --max-steps "$ALF_BUDGET" --out-dir "$RUNS/alfworld-bf16" --resume --workers "$WORKERS"
  finish "$RUNS/alfworld-bf16/results.jsonl" table1_alfworld_bf16
  table table1_alfworld_dtypes
}

table1_bf16_timed() {  # the bfloat16 Table 1 timed whole on the current code (report's running time line)
  seed "$RUNS/alfworld-bf16-timed/results.jsonl" results/table1_alfworld_bf16_timed.results.jsonl.gz
  "$CB" run --env alfworld --dtype bfloat16 --agent react --agent prior-only --agent cb-agent --all-games \
    --max-steps "$ALF_BUDGET" --out-dir "$RUNS/alfworld-bf16-timed" --resume --workers "$WORKERS"
  finish "$RUNS/alfworld-bf16-timed/results.jsonl" table1_alfworld_bf16_timed
}

table1_reflexion() {  # the Reflexion rows of Table 1 (two trials each)
  seed "$RUNS/alfworld-reflexion/results.jsonl" results/table1_alfworld_reflexion.results.jsonl.gz
  grown --agent reflexion-react --agent reflexion-cb-agent --out-dir "$RUNS/alfworld-reflexion" --workers "$WORKERS"
  finish "$RUNS/alfworld-reflexion/results.jsonl" table1_alfworld_reflexion
  table table1_alfworld_with_reflexion
}

table1_features() {  # the extra feature blocks on the Table 1 games (needs `run --features`)
  seed "$RUNS/alfworld-features/results.jsonl" results/table1_alfworld_features.results.jsonl.gz
  grown --agent cb-agent --features lm-hidden,goal-similarity,novelty --out-dir "$RUNS/alfworld-features" \
    --workers "$WORKERS"
  finish "$RUNS/alfworld-features/results.jsonl" table1_alfworld_features
  table table1_alfworld_combined  # beside Table 1's three agents, the same games paired
}

ical() {  # ICAL memory from 30 corrupted expert trajectories (anchored decoding), retrieval
          # precision, and ReAct / CB-Agent on Table 1's games with the retrieved examples (no annotations;
          # with annotations on one game per type); the expert-demonstration rows are table1's
  local dir="${ICAL:-runs/ical}" k
  local mem="$dir/mem"
  mkdir -p "$dir"
  seed "$RUNS/alfworld/results.jsonl" results/table1_alfworld.results.jsonl.gz
  seed "$RUNS/alfworld-ical-actions/results.jsonl" results/ical_alfworld_actions.results.jsonl.gz
  seed "$RUNS/alfworld-ical-notes/results.jsonl" results/ical_alfworld_notes.results.jsonl.gz
  "$CB" ical noisy --expert-per-type 5 --corruptions 2 --out "$dir/noisy.jsonl" --resume
  "$CB" ical build-memory "$dir/noisy.jsonl" --memory "$mem" --decoding anchored --max-rounds 1 "${COMMON[@]}" --resume
  for k in 2 10; do
    "$CB" ical retrieve "$mem" --split valid_unseen --per-type 5 --k "$k" --lambda-instruction 1 --lambda-text 0 \
      --out "$dir/precision_k$k.jsonl" --resume
  done
  grown --agent react --agent cb-agent --demos "ical-actions:$mem" --out-dir "$RUNS/alfworld-ical-actions" \
    --workers "$WORKERS"
  "$CB" run --env alfworld "${COMMON[@]}" --agent react --demos "ical:$mem" \
    --per-type 1 --games 0 --max-steps "$ALF_BUDGET" --out-dir "$RUNS/alfworld-ical-notes" --resume --workers "$WORKERS"
  gzip -nc "$mem/log.jsonl" > results/ical_memory_log.jsonl.gz
  gzip -nc "$mem/examples.jsonl" > results/ical_memory_examples.jsonl.gz
  finish "$RUNS/alfworld-ical-actions/results.jsonl" ical_alfworld_actions
  finish "$RUNS/alfworld-ical-notes/results.jsonl" ical_alfworld_notes
  table ical_alfworld_combined
}

# games LEVEL N: --game options for the first N test seeds of a TextWorld level
games() { local s; for s in $(seq 100001 $((100000 + $2))); do printf -- '--game %s/test/%s ' "$1" "$s"; done; }

table3() {  # TextWorld levels: concepts from 2 train walkthroughs per level, disjoint test seeds, budget 20;
            # grown in rounds of test seeds over all levels at once (balanced partial results)
  local level n args out="$RUNS/textworld"
  seed "$out/results.jsonl" results/table3_textworld.results.jsonl.gz
  for n in $(seq 3 3 "$TW_GAMES"; [ $((TW_GAMES % 3)) -ne 0 ] && echo "$TW_GAMES"); do
    args=()
    for level in ${TW_LEVELS:-custom-1 cooking-1 custom-2 cooking-2}; do args+=($(games "$level" "$n")); done
    "$CB" run --env textworld --split test "${COMMON[@]}" --agent react --agent prior-only --agent cb-agent \
      "${args[@]}" --max-steps 20 --out-dir "$out" --resume
  done
  finish "$out/results.jsonl" table3_textworld
}

improve() {  # `cb-agent improve` on Table 3's games (TextWorld test seeds, budget 20): round 0 is the expert-data
              # concept, then $ROUNDS rounds of play on $ROUND_GAMES training games per level that the expert data did
              # not use, the won episodes refitting the concept; react and prior-only beside round 0 are Table 3's
              # own episodes (the same games and settings); what each round's concepts learned: eval-decisions on the
              # held-out expert decisions of the test games
  local level k args=() out="$RUNS/improve-textworld"
  for level in ${TW_LEVELS:-custom-1 cooking-1 custom-2 cooking-2}; do args+=($(games "$level" "$TW_GAMES")); done
  "$CB" improve --env textworld --split test "${COMMON[@]}" "${args[@]}" --max-steps 20 --rounds "${ROUNDS:-3}" \
    --games-per-round "${ROUND_GAMES:-6}" --out-dir "$out" --resume
  { gzip -dc results/table3_textworld.results.jsonl.gz | grep -v '^{"schema":"cb-agent/episode-v1","agent":"cb-agent",'
    cat "$out"/round-*/results.jsonl; } > "$out/beside_table3.jsonl"
  finish "$out/beside_table3.jsonl" improve_textworld
  cp "$out/rounds.jsonl" results/improve_textworld_rounds.jsonl
  round_decisions "$out" improve_textworld --env textworld --heldout-split test --heldout-per-type "$TW_GAMES"
}

round_decisions() {  # OUT NAME ARGS...: what each finished round of the improve run in OUT learned, as top-1 on
                     # held-out expert decisions (eval-decisions ARGS --concepts OUT/round-K/concepts, teacher
                     # forcing) -> results/NAME_decisions_roundK.json
  local out=$1 name=$2 k
  shift 2
  for k in $(seq 0 "${ROUNDS:-3}"); do
    [ -d "$out/round-$k/concepts" ] || break
    "$CB" eval-decisions "$@" "${COMMON[@]}" --concepts "$out/round-$k/concepts" \
      --out "results/${name}_decisions_round$k.json"
  done
}

improve_alfworld() {  # `cb-agent improve` on Table 1's games (ALFWorld valid_unseen, 134, budget 50): round 0's
                      # evaluation is Table 1's cb-agent (seeded from its results file: the same command, replayed
                      # action for action by benchmarks/replay_actions.py), then $ALF_ROUNDS rounds of 6 training games
                      # per type; a type no won training game refitted keeps its evaluation episodes
  local out="$RUNS/improve-alfworld"
  seed_round0 "$out" results/table1_alfworld.results.jsonl.gz
  "$CB" improve --env alfworld --split valid_unseen --all-games "${COMMON[@]}" --max-steps "$ALF_BUDGET" \
    --rounds "${ALF_ROUNDS:-2}" --games-per-round "${ROUND_GAMES:-6}" --out-dir "$out" --resume --workers "$WORKERS"
  { gzip -dc results/table1_alfworld.results.jsonl.gz | grep -v '^{"schema":"cb-agent/episode-v1","agent":"cb-agent",'
    cat "$out"/round-*/results.jsonl; } > "$out/beside_table1.jsonl"
  finish "$out/beside_table1.jsonl" improve_alfworld
  cp "$out/rounds.jsonl" results/improve_alfworld_rounds.jsonl
}

improve_relabelled() {  # one arm of relabelled rounds beside own wins: LABELS (expert or wins, default expert),
                        # FEATURES (default lm-hidden; lm-hidden,novelty) and IMPROVE_ENV (textworld, default: Table
                        # 3's games and the improve target's settings; alfworld: Table 1's 134 valid_unseen games at
                        # $ALF_BUDGET, the improve_alfworld target's settings); round 0 of an lm-hidden arm is the same
                        # concept as the improve target's (TextWorld) or Table 1's cb-agent (ALFWorld), seeded from its
                        # results, not played again; results/improve_<env>_<labels>[_novelty].{md,png,results.jsonl.gz}
                        # and _rounds.jsonl (each round's training play per type: wins, decisions added, on-policy
                        # agreement, unlabelled states), _decisions_roundK.json (each round's concepts on held-out
                        # expert decisions), .train.jsonl.gz and .labelled.jsonl.gz (the rounds' training play and
                        # its expert labels: a fresh checkout resumes after the committed rounds, seed_rounds).
                        # ALFWorld: hours a round on a CPU, one thread a worker ($WORKERS)
  local level args=() labels=${LABELS:-expert} features=${FEATURES:-lm-hidden} env=${IMPROVE_ENV:-textworld}
  local name out seeds round0 held=()
  name=improve_${env}_$labels$([ "$features" = lm-hidden ] || echo _novelty)
  out="$RUNS/improve-$env-$labels-${features//,/-}"
  case "$env" in
    textworld)
      for level in ${TW_LEVELS:-custom-1 cooking-1 custom-2 cooking-2}; do args+=($(games "$level" "$TW_GAMES")); done
      args=(--env textworld --split test "${args[@]}" --max-steps 20)
      seeds=improve_textworld round0='"concept_round":0,'
      held=(--env textworld --heldout-split test --heldout-per-type "$TW_GAMES") ;;
    alfworld)
      args=(--env alfworld --split valid_unseen --all-games --max-steps "$ALF_BUDGET")
      seeds=table1_alfworld held=(--env alfworld --heldout-per-type 5) ;;  # Table 4's 508 held-out decisions
    *) echo "IMPROVE_ENV must be textworld or alfworld, not $env" >&2; exit 2 ;;
  esac
  seed_rounds "$out" "$name"  # the rounds a committed run finished (with its training play and labels)
  if [ "$features" = lm-hidden ]; then seed_round0 "$out" "results/$seeds.results.jsonl.gz" "${round0:-}"; fi
  "$CB" improve "${args[@]}" "${COMMON[@]}" --rounds "${ROUNDS:-3}" --games-per-round "${ROUND_GAMES:-6}" \
    --labels "$labels" --features "$features" --out-dir "$out" --resume --workers "$WORKERS"
  cat "$out"/round-*/results.jsonl > "$out/rounds_results.jsonl"
  gzip -nc "$out/rounds_results.jsonl" > "results/$name.results.jsonl.gz"
  cat "$out"/round-*/train.jsonl | gzip -nc > "results/$name.train.jsonl.gz"  # what seed_rounds resumes from
  cat "$out"/round-*/labelled.jsonl | gzip -nc > "results/$name.labelled.jsonl.gz"
  cp "$out/rounds.jsonl" "results/${name}_rounds.jsonl"
  "$CB" report "$out/rounds_results.jsonl" --paired --rounds "$out/rounds.jsonl" --markdown "results/$name.md" \
    --chart "results/$name.png"  # as its TABLES line (NAME: NAME --paired --rounds) regenerates it
  round_decisions "$out" "$name" "${held[@]}" --features "$features"
}

table2() {  # ScienceWorld: one test variation of each task, open action space (20 sampled replies, T = 0.7);
            # the concept's fit sees the expert's action and 63 sampled others of the ~1,000 valid combinations
  local tasks out="$RUNS/scienceworld" t
  seed "$out/results.jsonl" results/table2_scienceworld.results.jsonl.gz
  tasks=$("$CB" tasks --env scienceworld --split test | awk -F/ '!seen[$1]++' | head -n "${SW_TASKS:-30}")
  local args=()
  for t in $tasks; do args+=(--game "$t"); done
  "$CB" run --env scienceworld --split test "${COMMON[@]}" --agent react --agent prior-only --agent cb-agent \
    --action-space open "${args[@]}" --max-steps "${SW_BUDGET:-50}" --fit-candidates "${SW_FIT_CANDIDATES:-64}" \
    --out-dir "$out" --resume --workers "$WORKERS"
  finish "$out/results.jsonl" table2_scienceworld
}

calibration() {  # labels from ReAct / prior-only runs on training games that are no
                 # demonstrations, the calibrator and its content-screening ablation, then CB-Agent on
                 # Table 1's 30 games with Causal and Calibrator histories (Raw: table1's runs), the
                 # recovery study with the calibrator, and the joint actors
  local dir="${CAL:-runs/calibration}" ids t g h args=()
  mkdir -p "$dir"
  seed "$dir/labels.jsonl" results/calibration_labels.jsonl.gz
  seed "$dir/recover.jsonl" results/calibration_recover.jsonl.gz
  seed "$RUNS/alfworld/results.jsonl" results/table1_alfworld.results.jsonl.gz
  for h in causal calibrator joint; do
    seed "$RUNS/alfworld-$h/results.jsonl" "results/calibration_alfworld_$h.results.jsonl.gz"
  done
  ids=$("$CB" tasks --env alfworld --split train)
  for t in $(printf '%s\n' "$ids" | cut -d- -f1 | sort -u); do  # the last CAL_PER_TYPE games of each type
    for g in $(printf '%s\n' "$ids" | grep "^$t-" | tail -n "${CAL_PER_TYPE:-2}"); do args+=(--game "$g"); done
  done
  "$CB" run --env alfworld --split train --demo-split train "${COMMON[@]}" --agent react --agent prior-only \
    "${args[@]}" --max-steps "${CAL_STEPS:-20}" --out-dir "$dir/train" --resume --workers "$WORKERS"
  "$CB" calibrate label "$dir/train/results.jsonl" --actor react --actor prior-only --k 6 \
    --max-transitions "${CAL_TRANSITIONS:-80}" "${COMMON[@]}" --out "$dir/labels.jsonl" --resume
  "$CB" calibrate fit "$dir/labels.jsonl" "${COMMON[@]}" --out "$dir/calibrator.safetensors"
  "$CB" calibrate fit "$dir/labels.jsonl" --labels content "${COMMON[@]}" --out "$dir/content.safetensors"
  for h in causal calibrator; do
    "$CB" run --env alfworld "${COMMON[@]}" --agent cb-agent --history "$h" \
      $([ "$h" = calibrator ] && echo --calibrator "$dir/calibrator.safetensors") \
      $(alf_games) --max-steps "$ALF_BUDGET" --out-dir "$RUNS/alfworld-$h" --resume --workers "$WORKERS"
    finish "$RUNS/alfworld-$h/results.jsonl" "calibration_alfworld_$h"
  done
  table calibration_alfworld_histories  # Raw, Causal and Calibrator on the same games (Raw: Table 1's run)
  "$CB" recover "$RUNS/alfworld/results.jsonl" --agent cb-agent --history raw --history calibrator \
    --calibrator "$dir/calibrator.safetensors" --max-items "${CAL_RECOVER:-20}" "${COMMON[@]}" \
    --out "$dir/recover.jsonl" --resume | tee results/calibration_recover.txt
  gzip -nc "$dir/recover.jsonl" > results/calibration_recover.jsonl.gz
  "$CB" run --env alfworld "${COMMON[@]}" --agent joint-react --agent joint-cb-agent \
    $(alf_games) --max-steps "$ALF_BUDGET" --out-dir "$RUNS/alfworld-joint" --resume --workers "$WORKERS"
  finish "$RUNS/alfworld-joint/results.jsonl" calibration_alfworld_joint
  table calibration_alfworld_joint_vs_table1
  gzip -nc "$dir/labels.jsonl" > results/calibration_labels.jsonl.gz
  cp "$dir/labels.jsonl.counts.json" results/calibration_label_counts.json
  cp "$dir/calibrator.safetensors.eval.json" results/calibration_calibrator_eval.json
  cp "$dir/content.safetensors.eval.json" results/calibration_content_eval.json
}

tables() {  # every table of TABLES from the committed results files alone (no model, no game)
  local name
  for name in $(printf '%s' "$TABLES" | awk -F: 'NF { print $1 }'); do table "$name"; done
}

targets=("$@")
[ ${#targets[@]} -eq 0 ] && { echo "usage: $0 figure|table1|table1_bf16|table1_bf16_timed|table1_reflexion|table1_features|table2|table3|table4|table4_closed_loop|ical|calibration|improve|improve_alfworld|improve_relabelled|tables|all ..." >&2; exit 2; }
for target in "${targets[@]}"; do
  case "$target" in
    all) figure; table4; table3; table1; table1_reflexion; table2 ;;
    figure|table1|table1_bf16|table1_bf16_timed|table1_reflexion|table1_features|table2|table3|table4|table4_closed_loop|ical|calibration|improve|improve_alfworld|improve_relabelled|tables) "$target" ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
done

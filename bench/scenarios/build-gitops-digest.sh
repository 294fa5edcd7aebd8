#!/usr/bin/env bash
# Scenario 34, build-gitops-digest: the whole chain on a real (one-node is enough) cluster.
#
#   KUBE_CONTEXT=bench FABRIQUE_VALUES=site.yaml GITEA_URL=http://gitea.example:3000 \
#   FABRIQUE_GITEA_TOKEN=… FABRIQUE_WEBHOOK_TOKEN=… \
#   bash bench/scenarios/build-gitops-digest.sh
#
# The bench has fabrique installed (the rendered tree applied, its Secrets made), Argo CD
# deploying the Applications of the apps repository (its root Application), its server
# reachable from Gitea (the hooks seed keeps tell it of each push: nothing here asks it
# to refresh), and the app's code repository holding its build context and its
# kustomize overlay.
#
# No reachable cluster or chain: prints "SKIP: <reason>" and exits 0 (1 with STRICT=1).
# Safe to run again: it pushes new toy commits each time, and its EXIT trap puts the
# EventSource back and removes its scratch directory.
#
# An app with environments (apps[].environments) is seeded and checked in its first one,
# the bench (its Application and namespace, TARGET its target); once every gate passed,
# the script posts each of that environment's checks as `success` on the built commit,
# then (PROMOTE=0 leaves it out) promotes into the next environment and, when that one
# is in the same kube context, seeds it and waits for its pods on the same digest.
#
# TIMINGS=FILE writes the chain's stage times of the second push there (JSON, seconds
# since the push). POLL (default 5) is the seconds between two looks; TIMEOUT (900) bounds
# each wait. SAFETY_NET=0 leaves out the last step (a push the event path never sees),
# which needs the EventSource to be a Deployment it can scale to zero.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
app="${APP:-citation}"
control_ns="${CONTROL_NAMESPACE:-fabrique}"
build_ns="${BUILD_NAMESPACE:-fabrique-build}"
timeout_s="${TIMEOUT:-900}"
poll_s="${POLL:-5}"
python="${PYTHON:-$root/.venv/bin/python}"
fabrique="${FABRIQUE:-$root/.venv/bin/fabrique}"
ctx=(--context "${KUBE_CONTEXT:-$(kubectl config current-context 2>/dev/null || echo none)}")
scratch="$(mktemp -d)"
scaled_down=""

skip() {
  if [ "${STRICT:-0}" = "1" ]; then echo "FAIL: $1 (STRICT=1)"; exit 1; fi
  echo "SKIP: $1"; exit 0
}

cleanup() {
  if [ -n "$scaled_down" ]; then
    kubectl "${ctx[@]}" -n "$control_ns" scale deploy -l eventsource-name=gitea --replicas=1 >/dev/null || true
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT

gate() { "$python" "$here/gates.py" "$@"; }

wait_for() {  # wait_for DESCRIPTION COMMAND…: until the command succeeds, or the timeout
  local what="$1"; shift
  local deadline=$((SECONDS + timeout_s))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "FAIL: timed out after ${timeout_s}s waiting for $what"; exit 1; }
    sleep "$poll_s"
  done
}

k() { kubectl "${ctx[@]}" "$@"; }
api() {  # api PATH: Gitea's API, as fabrique's user
  curl -fsS --max-time 10 -H "Authorization: token $FABRIQUE_GITEA_TOKEN" "$GITEA_URL/api/v1/$1"
}
jq_py() { "$python" -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# ---- is there a chain to test? ----------------------------------------------------
command -v kubectl >/dev/null || skip "kubectl is not installed"
command -v curl >/dev/null || skip "curl is not installed"
[ -x "$fabrique" ] || skip "fabrique is not installed ($fabrique); run make render"
k version --request-timeout=5s >/dev/null 2>&1 || skip "no reachable cluster (${ctx[1]})"
for crd in workflows.argoproj.io sensors.argoproj.io applications.argoproj.io; do
  k get crd "$crd" >/dev/null 2>&1 || skip "CRD $crd missing: install Argo Workflows, Argo Events and Argo CD"
done
[ -n "${GITEA_URL:-}" ] && [ -n "${FABRIQUE_GITEA_TOKEN:-}" ] || skip "GITEA_URL and FABRIQUE_GITEA_TOKEN are needed to push"
workers="$(k get nodes -l '!node-role.kubernetes.io/control-plane' -o name | wc -l)"
[ "$workers" -gt 0 ] || skip "no worker node: the builder never runs on the control plane"

config() { "$fabrique" config show | "$python" -c "import sys,yaml; c=yaml.safe_load(sys.stdin); print($1)"; }
code_repo="$(config 'c["gitea"]["codeRepo"]')"
context_dir="$(config "next(a['context'] for a in c['apps'] if a['name']=='$app')")"
# each environment: name, target, context, Argo CD's namespace, the Application, the app's
# namespace, its checks (one line, no environment: the app's own Application)
mapfile -t stages < <("$python" "$here/environments.py" "$app")
[ "${#stages[@]}" -gt 0 ] || { echo "FAIL: no environment of $app in the site"; exit 1; }
IFS=$'\t' read -r -a bench_stage <<< "${stages[0]}"
env_name="${bench_stage[0]}"
argocd_ns="${ARGOCD_NAMESPACE:-${bench_stage[3]}}"
application="${bench_stage[4]}"
app_ns="${bench_stage[5]}"
checks=("${bench_stage[@]:6}")
if [ "$env_name" = "-" ]; then target="${TARGET:-prod}"; else target="${TARGET:-${bench_stage[1]}}"; fi

push_toy_commit() {  # prints the new commit id
  local dir="$scratch/code-$1"
  git -c http.extraHeader="Authorization: token $FABRIQUE_GITEA_TOKEN" clone -q --depth 1 "$GITEA_URL/$code_repo.git" "$dir"
  date -u +%FT%T.%NZ > "$dir/$context_dir/.scenario-stamp"
  git -C "$dir" add -A
  git -C "$dir" -c user.name=scenario -c user.email=scenario@example.invalid commit -qm "scenario 34: toy change ($1)"
  git -C "$dir" -c http.extraHeader="Authorization: token $FABRIQUE_GITEA_TOKEN" push -q origin HEAD
  git -C "$dir" rev-parse HEAD
}

phase_is() {  # phase_is WORKFLOW PHASE
  [ "$(k -n "$build_ns" get workflow "$1" -o jsonpath='{.status.phase}')" = "$2" ]
}

built() {  # built REVISION: waits for its Workflow to succeed; prints the digest it wrote back
  local workflow="fabrique-$app-${1:0:12}"
  wait_for "the event path to create Workflow $workflow" k -n "$build_ns" get workflow "$workflow"
  until phase_is "$workflow" Succeeded; do
    # its words to stderr: stdout is the digest its caller reads
    if phase_is "$workflow" Failed || phase_is "$workflow" Error; then
      echo "FAIL: Workflow $workflow: $(k -n "$build_ns" get workflow "$workflow" -o json | jq_py \
        '"; ".join(v["displayName"] + ": " + v.get("message", "") for v in d["status"]["nodes"].values() if v.get("phase") in ("Failed", "Error")) or d["status"].get("message", "")')" >&2
      exit 1
    fi
    [ "$SECONDS" -lt "$((started + timeout_s))" ] || { echo "FAIL: timed out waiting for Workflow $workflow to succeed" >&2; exit 1; }
    sleep "$poll_s"
  done
  k -n "$build_ns" get workflow "$workflow" -o json | jq_py \
    'next(p["value"] for v in d["status"]["nodes"].values() for p in (v.get("outputs") or {}).get("parameters", []) if p["name"]=="digest")'
}

deployed() {  # deployed DIGEST [ARGOCD_NS APPLICATION NAMESPACE]: the Application Synced
  # and Healthy, every pod of its namespace Ready on DIGEST (the bench's by default)
  k -n "${2:-$argocd_ns}" get application "${3:-$application}" -o json > "$scratch/app.json" &&
    gate application-synced-healthy "$scratch/app.json" &&
    k -n "${4:-$app_ns}" get pods -o json > "$scratch/pods.json" &&
    gate pods-ready-by-digest "$scratch/pods.json" &&
    "$python" -c 'import json,sys; pods=json.load(open(sys.argv[1]))["items"]
sys.exit(not pods or any(sys.argv[2] not in c["image"] for p in pods for c in p["spec"]["containers"]))' \
      "$scratch/pods.json" "$1"
}

# ---- flow ----------------------------------------------------------------------------
echo "1. apply the rendered tree"
"$fabrique" render --out "$scratch/manifests" >/dev/null
k apply --server-side --field-manager=fabrique -k "$scratch/manifests" >/dev/null

echo "2. seed webhook #2, so that a push reaches the EventSource"
"$fabrique" seed-webhook

echo "3. push a toy commit to $context_dir: the first build of the app"
started=$SECONDS
first="$(push_toy_commit first)"
echo "   pushed $first"
first_digest="$(built "$first")"
echo "   built $first_digest"

echo "4. fabrique seed: the Application, the derived Secrets, webhook #2, Argo CD's hooks, the digest"
"$fabrique" seed --app "$app" --target "$target" "${ctx[@]}" --yes

# Nothing here asks Argo CD to look at Git: seed's hooks tell it of each push (the
# Application seed commits, each write-back), and it syncs because Gitea told it
echo "5. Argo CD deploys it"
started=$SECONDS
wait_for "Application $application" k -n "$argocd_ns" get application "$application"
wait_for "Application $application Synced and Healthy, its pods Ready on $first_digest" deployed "$first_digest"

echo "6. push again: the chain's own time, from the push to the pod"
started=$SECONDS
pushed_at="$(date +%s.%N)"
revision="$(push_toy_commit second)"
echo "   pushed $revision"
digest="$(built "$revision")"
echo "   built $digest"
wait_for "Application $application Synced and Healthy, its pods Ready on $digest" deployed "$digest"
workflow="fabrique-$app-${revision:0:12}"

echo "gates"
k -n "$app_ns" get deploy,statefulset -o json > "$scratch/workloads.json"
gate deployed-by-digest "$scratch/workloads.json"
gate application-synced-healthy "$scratch/app.json"
gate pods-ready-by-digest "$scratch/pods.json"
grep -q "$digest" "$scratch/workloads.json" || { echo "FAIL: the workloads do not name $digest"; exit 1; }

before="$(git ls-remote "$GITEA_URL/$code_repo.git" HEAD | cut -f1)"
"$fabrique" seed --app "$app" --target "$target" "${ctx[@]}" --yes > "$scratch/seed.out"
"$fabrique" submit --app "$app" --revision "$revision" "${ctx[@]}" > "$scratch/submit.out"
"$fabrique" writeback --app "$app" --revision "$revision" --digest "$digest" > "$scratch/writeback.out"
after="$(git ls-remote "$GITEA_URL/$code_repo.git" HEAD | cut -f1)"
echo "$before" > "$scratch/before"; echo "$after" > "$scratch/after"
gate seed-replay-unchanged "$scratch/seed.out" "$scratch/before" "$scratch/after"
gate replay-is-noop "$scratch/submit.out" "$scratch/writeback.out" "$scratch/before" "$scratch/after"

api "repos/$code_repo/commits/$revision/statuses?limit=50" > "$scratch/statuses.json"
gate status-success "$scratch/statuses.json" "$app" "$digest"

for check in "${checks[@]}"; do  # the bench's own checks: what promote reads
  body="$("$python" -c 'import json,sys; print(json.dumps({"context": sys.argv[1], "state": "success",
"description": "scenario 34: every gate passed"}))' "$check")"
  curl -fsS --max-time 10 -X POST -H "Authorization: token $FABRIQUE_GITEA_TOKEN" \
    -H "Content-Type: application/json" -d "$body" \
    "$GITEA_URL/api/v1/repos/$code_repo/statuses/$revision" >/dev/null
  echo "   posted $check: success on ${revision:0:12}"
done

if [ "${#stages[@]}" -gt 1 ] && [ "${PROMOTE:-1}" = "1" ]; then
  IFS=$'\t' read -r -a next_stage <<< "${stages[1]}"
  echo "promote: $env_name -> ${next_stage[0]}, the same digest"
  "$fabrique" promote --app "$app" --to "${next_stage[0]}"
  if [ "${next_stage[2]}" = "${ctx[1]}" ]; then
    "$fabrique" seed --app "$app" --target "${next_stage[1]}" "${ctx[@]}" --yes
    wait_for "Application ${next_stage[4]}" k -n "${next_stage[3]}" get application "${next_stage[4]}"
    wait_for "Application ${next_stage[4]} Synced and Healthy, its pods Ready on $digest" \
      deployed "$digest" "${next_stage[3]}" "${next_stage[4]}" "${next_stage[5]}"
  else
    echo "   ${next_stage[0]} is in context ${next_stage[2]}: seed it from there"
  fi
fi

if [ -n "${TIMINGS:-}" ]; then
  k -n "$build_ns" get workflow "$workflow" -o json > "$scratch/workflow.json"
  api "repos/$code_repo/git/commits/$after" > "$scratch/writeback-commit.json"
  "$python" "$here/timings.py" "$pushed_at" "$scratch/workflow.json" \
    "$scratch/writeback-commit.json" "$scratch/app.json" "$scratch/pods.json" > "$TIMINGS"
  echo "timings: $(cat "$TIMINGS")"
fi

if [ "${SAFETY_NET:-1}" = "1" ]; then
  echo "7. a push while the EventSource is scaled to zero is caught by the next reconcile pass"
  k -n "$control_ns" scale deploy -l eventsource-name=gitea --replicas=0 >/dev/null
  scaled_down=yes
  lost="$(push_toy_commit lost)"
  started=$SECONDS
  "$fabrique" reconcile --app "$app" "${ctx[@]}"
  wait_for "the reconciled build of ${lost:0:12}" phase_is "fabrique-$app-${lost:0:12}" Succeeded
  "$fabrique" reconcile --app "$app" "${ctx[@]}" >/dev/null
  "$fabrique" status --app "$app" --output json "${ctx[@]}" > "$scratch/status.json"
  gate reconciled "$scratch/status.json" "$app" "$lost"
else
  echo "7. left out (SAFETY_NET=0): a push the event path never sees"
fi
echo "PASS: build-gitops-digest"

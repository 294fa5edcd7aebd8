#!/usr/bin/env bash
# Scenario 34, build-gitops-digest: the whole chain on a real (one-node is enough) cluster.
#
#   KUBE_CONTEXT=bench FABRIQUE_VALUES=site.yaml GITEA_URL=http://localhost:3000 \
#   FABRIQUE_GITEA_TOKEN=… FABRIQUE_WEBHOOK_TOKEN=… \
#   bash bench/scenarios/build-gitops-digest.sh
#
# No reachable cluster or chain: prints "SKIP: <reason>" and exits 0 (1 with STRICT=1).
# Safe to run again: it pushes a new toy commit each time, and its EXIT trap puts the
# EventSource back and removes its scratch directory.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
app="${APP:-citation}"
app_ns="${APP_NAMESPACE:-dagster}"
control_ns="${CONTROL_NAMESPACE:-fabrique}"
build_ns="${BUILD_NAMESPACE:-fabrique-build}"
timeout_s="${TIMEOUT:-900}"
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
    [ "$SECONDS" -lt "$deadline" ] || { echo "FAIL: timed out waiting for $what"; exit 1; }
    sleep 5
  done
}

# ---- is there a chain to test? ----------------------------------------------------
command -v kubectl >/dev/null || skip "kubectl is not installed"
[ -x "$fabrique" ] || skip "fabrique is not installed ($fabrique); run make render"
kubectl "${ctx[@]}" version --request-timeout=5s >/dev/null 2>&1 || skip "no reachable cluster (${ctx[1]})"
for crd in workflows.argoproj.io sensors.argoproj.io applications.argoproj.io; do
  kubectl "${ctx[@]}" get crd "$crd" >/dev/null 2>&1 || skip "CRD $crd missing: install Argo Workflows, Argo Events and Argo CD"
done
[ -n "${GITEA_URL:-}" ] && [ -n "${FABRIQUE_GITEA_TOKEN:-}" ] || skip "GITEA_URL and FABRIQUE_GITEA_TOKEN are needed to push"

# ---- flow ----------------------------------------------------------------------------
echo "1. apply the rendered tree"
"$fabrique" render --out "$scratch/manifests" >/dev/null
kubectl "${ctx[@]}" apply -k "$scratch/manifests" >/dev/null

echo "2. seed the webhook"
"$fabrique" seed-webhook

code_repo="$("$fabrique" config show | "$python" -c 'import sys,yaml; print(yaml.safe_load(sys.stdin)["gitea"]["codeRepo"])')"
context_dir="$("$fabrique" config show | "$python" -c "import sys,yaml; print(next(a['context'] for a in yaml.safe_load(sys.stdin)['apps'] if a['name']=='$app'))")"
push_toy_commit() {  # prints the new commit id
  local dir="$scratch/code-$1"
  git -c http.extraHeader="Authorization: token $FABRIQUE_GITEA_TOKEN" clone -q --depth 1 "$GITEA_URL/$code_repo.git" "$dir"
  date -u +%FT%TZ > "$dir/$context_dir/.scenario-stamp"
  git -C "$dir" add -A
  git -C "$dir" -c user.name=scenario -c user.email=scenario@example.invalid commit -qm "scenario 34: toy change ($1)"
  git -C "$dir" -c http.extraHeader="Authorization: token $FABRIQUE_GITEA_TOKEN" push -q origin HEAD
  git -C "$dir" rev-parse HEAD
}

echo "3. push a toy commit to $context_dir"
revision="$(push_toy_commit first)"
workflow="fabrique-$app-${revision:0:12}"

echo "4. wait for Workflow $workflow"
wait_for "Workflow $workflow to succeed" \
  sh -c "kubectl ${ctx[*]} -n $build_ns get workflow $workflow -o jsonpath='{.status.phase}' | grep -qx Succeeded"
wait_for "Application $app to be Synced and Healthy" \
  sh -c "kubectl ${ctx[*]} -n argocd get application $app -o json > $scratch/app.json && $python $here/gates.py application-synced-healthy $scratch/app.json"

echo "gates"
kubectl "${ctx[@]}" -n "$app_ns" get deploy,statefulset -o json > "$scratch/workloads.json"
gate deployed-by-digest "$scratch/workloads.json"
gate application-synced-healthy "$scratch/app.json"
kubectl "${ctx[@]}" -n "$app_ns" get pods -o json > "$scratch/pods.json"
gate pods-ready-by-digest "$scratch/pods.json"

before="$(git ls-remote "$GITEA_URL/$code_repo.git" HEAD | cut -f1)"
"$fabrique" submit --app "$app" --revision "$revision" --context "${ctx[1]}" > "$scratch/submit.out"
digest="$(kubectl "${ctx[@]}" -n "$build_ns" get workflow "$workflow" -o json | "$python" -c \
  'import json,sys; n=json.load(sys.stdin)["status"]["nodes"]; print(next(p["value"] for v in n.values() for p in (v.get("outputs") or {}).get("parameters", []) if p["name"]=="digest"))')"
"$fabrique" writeback --app "$app" --revision "$revision" --digest "$digest" > "$scratch/writeback.out"
after="$(git ls-remote "$GITEA_URL/$code_repo.git" HEAD | cut -f1)"
echo "$before" > "$scratch/before"; echo "$after" > "$scratch/after"
gate replay-is-noop "$scratch/submit.out" "$scratch/writeback.out" "$scratch/before" "$scratch/after"

echo "5. a push while the EventSource is scaled to zero is caught by the next reconcile pass"
kubectl "${ctx[@]}" -n "$control_ns" scale deploy -l eventsource-name=gitea --replicas=0 >/dev/null
scaled_down=yes
lost="$(push_toy_commit lost)"
"$fabrique" reconcile --app "$app" --context "${ctx[1]}"
wait_for "the reconciled build of ${lost:0:12}" \
  sh -c "kubectl ${ctx[*]} -n $build_ns get workflow fabrique-$app-${lost:0:12} -o jsonpath='{.status.phase}' | grep -qx Succeeded"
"$fabrique" reconcile --app "$app" --context "${ctx[1]}" >/dev/null
"$fabrique" status --app "$app" --output json --context "${ctx[1]}" > "$scratch/status.json"
gate reconciled "$scratch/status.json" "$app" "$lost"
echo "PASS: build-gitops-digest"

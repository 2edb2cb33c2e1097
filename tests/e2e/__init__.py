"""End-to-end tests: the operator installed with its chart, the examples applied with
kubectl, on the session's kind cluster (tests.support.kind) or the one of
STRATEGYJOB_E2E_KUBECONFIG."""

// The YAML oracle of tests/test_yaml_oracle.py, built by scripts/install-go-tools: sigs.k8s.io/yaml
// at the version the pinned Kubernetes (tools/versions.env) reads manifests with.
module gitops-agent.local/tools/go/yamljson

go 1.26.0

require sigs.k8s.io/yaml v1.6.0

require go.yaml.in/yaml/v2 v2.4.2 // indirect

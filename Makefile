# telorunner — `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
MODULES := pkg services/api-edge services/pod-driver services/supervisor services/workspace-proxy services/telorunner bench tools/devkernel tools/kubetest
# Test tools with their own heavy dependencies, kept out of go.work.
TOOL_MODULES := tools/standin-kubelet tools/chartcheck tools/images
BIN := $(CURDIR)/bin
TOOLS := $(CURDIR)/.tools/bin
GOLANGCI_VERSION := v2.15.0
PORT ?= 8062
TEST_FLAGS ?= -race -count=1 -timeout 20m
# Kubernetes control plane for tests (tools/kubeenv), cached once per machine and
# keyed by the pinned versions; tests find it through TELORUNNER_KUBE_BIN.
KUBE_VERSION := v1.37.2
KUBE_BIN ?= $(HOME)/.cache/telorunner/kube-$(KUBE_VERSION)-$(shell cat tools/kubeenv/go.sum tools/kubeenv/cmd/etcd/go.sum | sha256sum | cut -c1-12)
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) -X k8s.io/component-base/version.gitTreeState=clean
# The chaos suite (tests/chaos, its own module outside go.work) runs a real
# nats-server binary of the version the repository already uses (pkg/go.mod),
# built from the Go module proxy once per machine.
CHAOS_MODULE := tests/chaos
NATS_SERVER_VERSION := $(shell awk '$$1=="github.com/nats-io/nats-server/v2"{print $$2}' pkg/go.mod)
NATS_BIN ?= $(HOME)/.cache/telorunner/nats-server-$(NATS_SERVER_VERSION)
CHAOS_FLAGS ?= -race -count=1 -timeout 15m -v

# Images (tools/images): stamped with the commit, every file and the image
# dated at the commit's time, so the same commit gives the same digests.
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: help build run test vet fmt-check lint bench bench-peer clean kube-bins images push nats-bin test-chaos

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## build every binary into ./bin
	@mkdir -p $(BIN)
	cd services/telorunner && $(GO) build -o $(BIN)/telorunner ./cmd/telorunner && $(GO) build -o $(BIN)/iotail ./cmd/iotail && $(GO) build -o $(BIN)/telorunner-events ./cmd/telorunner-events
	cd services/api-edge && $(GO) build -o $(BIN)/api-edge ./cmd/api-edge
	cd services/pod-driver && $(GO) build -o $(BIN)/pod-driver ./cmd/pod-driver && CGO_ENABLED=0 $(GO) build -o $(BIN)/telo-layer ./cmd/telo-layer && CGO_ENABLED=0 $(GO) build -o $(BIN)/telorunner-sandbox ./cmd/telorunner-sandbox
	cd tools/devkernel && $(GO) build -o $(BIN)/devkernel ./cmd/devkernel
	cd services/supervisor && $(GO) build -o $(BIN)/supervisor ./cmd/supervisor
	cd services/workspace-proxy && $(GO) build -o $(BIN)/workspace-proxy ./cmd/workspace-proxy && $(GO) build -o $(BIN)/workspace-server ./cmd/workspace-server

images: ## OCI image of every service, the all-in-one and workspace-server into dist/oci (no daemon)
	cd tools/images && GOWORK=off $(GO) run . build -root $(CURDIR) -out $(CURDIR)/dist/oci -revision "$(REVISION)" -created "$(SOURCE_DATE_EPOCH)"

push: ## push dist/oci's images to $REGISTRY (host/path), credentials from ~/.docker/config.json
	@if [ -z "$(REGISTRY)" ]; then echo "push: REGISTRY=host/path is required"; exit 2; fi
	cd tools/images && GOWORK=off $(GO) run . push -root $(CURDIR) -out $(CURDIR)/dist/oci -registry "$(REGISTRY)"

run: build ## start the all-in-one (embedded NATS, local backend) on $PORT
	PORT=$(PORT) $(BIN)/telorunner

fmt-check: ## fail when gofmt would change a file
	@out=$$(gofmt -l $(MODULES) $(TOOL_MODULES) $(CHAOS_MODULE) 2>/dev/null); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet: ## go vet every module, in the workspace and with GOWORK=off
	@for m in $(MODULES); do echo "== vet $$m"; (cd $$m && $(GO) vet ./... && GOWORK=off $(GO) vet ./...) || exit 1; done

test: fmt-check vet kube-bins ## vet + race tests of every module (GOWORK=off: each module stands alone), then the chaos suite
	@for m in $(MODULES); do echo "== test $$m"; (cd $$m && TELORUNNER_KUBE_BIN=$(KUBE_BIN) GOWORK=off $(GO) test $(TEST_FLAGS) ./...) || exit 1; done
	@for m in $(TOOL_MODULES); do echo "== test $$m (test tool, outside go.work)"; (cd $$m && GOWORK=off $(GO) vet ./... && TELORUNNER_KUBE_BIN=$(KUBE_BIN) GOWORK=off $(GO) test $(TEST_FLAGS) ./...) || exit 1; done
	@echo "== test-chaos (every service kind and a NATS node killed, over a 3-node cluster)"
	@$(MAKE) --no-print-directory test-chaos

kube-bins: $(KUBE_BIN)/kube-apiserver $(KUBE_BIN)/kube-controller-manager $(KUBE_BIN)/etcd ## build the test control plane into $KUBE_BIN (once per machine) + standin-kubelet
	@if compgen -G "tools/standin-kubelet/*.go" >/dev/null; then \
		echo "== build $(KUBE_BIN)/standin-kubelet"; \
		cd tools/standin-kubelet && GOWORK=off $(GO) build -o $(KUBE_BIN)/standin-kubelet . ; \
	else \
		echo "kube-bins: no Go files in tools/standin-kubelet yet: standin-kubelet not built (tests that start a kubelet will fail)"; \
	fi
	@echo "kube-bins: TELORUNNER_KUBE_BIN=$(KUBE_BIN)"

$(KUBE_BIN)/kube-apiserver $(KUBE_BIN)/kube-controller-manager:
	@mkdir -p $(KUBE_BIN)
	@echo "== build $@ (cold: several minutes)"
	cd tools/kubeenv && GOWORK=off $(GO) build -ldflags '$(KUBE_LDFLAGS)' -o $@.tmp.$$$$ k8s.io/kubernetes/cmd/$(notdir $@) && mv $@.tmp.$$$$ $@

$(KUBE_BIN)/etcd:
	@mkdir -p $(KUBE_BIN)
	cd tools/kubeenv/cmd/etcd && GOWORK=off $(GO) build -o $@.tmp.$$$$ . && mv $@.tmp.$$$$ $@

nats-bin: $(NATS_BIN)/nats-server ## build nats-server (pkg/go.mod's version) into $NATS_BIN (once per machine)

$(NATS_BIN)/nats-server:
	@test -n "$(NATS_SERVER_VERSION)" || { echo "nats-bin: no github.com/nats-io/nats-server/v2 version in pkg/go.mod"; exit 1; }
	@mkdir -p $(NATS_BIN)/.tmp
	@echo "== build $@ ($(NATS_SERVER_VERSION), from the Go module proxy)"
	GOWORK=off GOBIN=$(NATS_BIN)/.tmp $(GO) install github.com/nats-io/nats-server/v2@$(NATS_SERVER_VERSION) && mv $(NATS_BIN)/.tmp/nats-server $@

test-chaos: build nats-bin ## chaos suite: services as processes over a 3-node NATS cluster, kill -9 of each kind (a few minutes)
	cd $(CHAOS_MODULE) && GOWORK=off $(GO) vet ./... && TELORUNNER_BIN=$(BIN) TELORUNNER_NATS_SERVER=$(NATS_BIN)/nats-server GOWORK=off $(GO) test $(CHAOS_FLAGS) ./...

lint: $(TOOLS)/golangci-lint ## golangci-lint v2 (installed into .tools at a pinned version)
	@for m in $(MODULES); do echo "== lint $$m"; (cd $$m && $(TOOLS)/golangci-lint run --config $(CURDIR)/.golangci.yml ./...) || exit 1; done

$(TOOLS)/golangci-lint:
	GOBIN=$(TOOLS) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION)

bench: kube-bins ## benchmarks, each figure with the samples it rests on (n=) and only the percentiles they support; baselines where docs/design/performance.md (Benchmarks) names one; the Kubernetes ones on the real API server
	cd bench && TELORUNNER_KUBE_BIN=$(KUBE_BIN) GOWORK=off $(GO) test -count=1 -timeout 90m -run 'TestPrint' -v -bench . -benchtime=3x ./...

bench-peer: build ## telorunner beside the reference runner (../shared/peer; npm registry needed): peerload io, sse, create against both, ratios ours ÷ reference, JSON under bench/out/
	bench/peer/bench-peer.sh

clean: ## remove build output and local state
	rm -rf $(BIN) .telorunner dist

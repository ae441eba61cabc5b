# Shortcuts; the README's two commands need none of this.

.PHONY: test demo bench fuzz jaeger-test

# Exactly what .ci/run runs.
test:
	go test -race -count=1 -timeout 20m ./... && go test -run '^$$' -fuzz FuzzDecode -fuzztime 300000x ./events

demo:
	go run ./cmd/effectline dev --demo

bench:
	go run ./cmd/effectline bench -n 10000
	go run ./cmd/effectline bench -n 5000 -rate 500

fuzz:
	go test ./events -run '^$$' -fuzz FuzzDecode -fuzztime 10000000x
	go test ./events -run '^$$' -fuzz '^FuzzCanonicalize$$' -fuzztime 10000000x

# The end-to-end trace test against a real Jaeger (built from tools/jaeger,
# ~16 minutes cold). CI runs the same scenario against an in-process OTLP
# receiver instead (TestTraceOfAnOperation).
jaeger-test:
	scripts/jaeger.sh start
	EFFECTLINE_JAEGER_URL=http://127.0.0.1:16686 go test ./cmd/effectline -run TestTraceInJaeger -count=1 -v; \
	  status=$$?; scripts/jaeger.sh stop; exit $$status

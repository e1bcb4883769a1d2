# autodiff.h - build, test, train, benchmark.
#   make test      every test, the compile matrix, the examples, a sanitizer build
#                  (tests on the real MNIST run when MNIST_DIR names its folder)
#   make mnist     find or fetch MNIST (MNIST_DIR, default data/mnist), train the MLP, report
#   make mnist-cnn the same with the convolutional network
#   make fashion   the MLP on Fashion-MNIST (Debian: apt-get install dataset-fashion-mnist)
#   make bench     benchmarks side by side with OpenBLAS and PyTorch where installed

CC ?= cc
CFLAGS ?= -O2
LDLIBS = -lm -lpthread
BUILD = build
MNIST_DIR ?= data/mnist

.PHONY: all test examples clean

all: examples

test:
	CC="$(CC)" bash tests/run.sh

examples: $(patsubst examples/%.c,$(BUILD)/%,$(wildcard examples/*.c))

$(BUILD)/%: examples/%.c autodiff.h
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

clean:
	rm -rf $(BUILD)

# Benchmarks (bench/run.sh): GEMM, tape overhead, optimizer steps, elementwise functions, MLP
# and CNN epochs against OpenBLAS and PyTorch where installed; prints one table and writes it to
# build/bench.md.
.PHONY: bench

bench:
	CC="$(CC)" bash bench/run.sh

# MNIST: found in MNIST_DIR, or downloaded there and checked (scripts/fetch_mnist.sh).
# Fashion-MNIST: the same files, from Debian's dataset-fashion-mnist package by default.
FASHION_DIR ?= /usr/share/datasets/fashion-mnist

.PHONY: data mnist mnist-cnn fashion

data:
	bash scripts/fetch_mnist.sh "$(MNIST_DIR)"

mnist: data
	@mkdir -p $(BUILD)
	$(CC) -O2 examples/mnist.c -o $(BUILD)/mnist -lm
	$(BUILD)/mnist --data "$(MNIST_DIR)" --checkpoint $(BUILD)/mnist.ckpt --plot $(BUILD)/mnist.svg

mnist-cnn: data
	@mkdir -p $(BUILD)
	$(CC) -O2 examples/mnist_cnn.c -o $(BUILD)/mnist_cnn -lm
	$(BUILD)/mnist_cnn --data "$(MNIST_DIR)" --checkpoint $(BUILD)/mnist_cnn.ckpt --plot $(BUILD)/mnist_cnn.svg

fashion:
	@bash scripts/fetch_mnist.sh --check "$(FASHION_DIR)" || { \
	    echo "Fashion-MNIST is not in $(FASHION_DIR). On Debian or Ubuntu: apt-get install dataset-fashion-mnist"; \
	    echo "(it installs /usr/share/datasets/fashion-mnist), or set FASHION_DIR to a folder with its four files."; \
	    exit 1; }
	@mkdir -p $(BUILD)
	$(CC) -O2 examples/mnist.c -o $(BUILD)/mnist -lm
	$(BUILD)/mnist --data "$(FASHION_DIR)" --checkpoint $(BUILD)/fashion.ckpt --plot $(BUILD)/fashion.svg

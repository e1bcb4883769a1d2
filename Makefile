# autodiff.h - build, test, train, benchmark.
#   make test      every test, the compile matrix, the examples, the fuzz corpora and sanitizer
#                  builds with gcc and clang (tests on the real MNIST run when MNIST_DIR names its
#                  folder, those on Tiny Shakespeare when SHAKESPEARE_DIR does); needs gcc, g++,
#                  clang, libclang-rt-14-dev and libstb-dev (and for the MPI tests mpicc and mpirun)
#   make mnist     find or fetch MNIST (MNIST_DIR, default data/mnist), train the MLP, report
#   make mnist-cnn the same with the convolutional network
#   make mnist-mpi NP=2  the MLP trained data-parallel on NP processes over MPI (default 2;
#                  needs mpicc and mpirun: Debian's openmpi-bin and libopenmpi-dev);
#                  make shakespeare-mpi NP=2 the same for the GPT
#   make shakespeare  find or fetch Tiny Shakespeare (SHAKESPEARE_DIR), train nanoGPT's character
#                  GPT on it, report and sample (SHAKESPEARE_ARGS passes options, e.g. --model lstm)
#   make fashion   the MLP on Fashion-MNIST (Debian: apt-get install dataset-fashion-mnist)
#   make predict   build/predict, which classifies image files with a saved checkpoint
#   make examples  every example program into build/
#   make fuzz      libFuzzer on each fuzz target of tests/fuzz for FUZZ_SECONDS (default 60);
#                  FUZZ_TARGETS="idx_fuzz ..." runs only those; needs clang and libclang-rt-14-dev
#   make bench     benchmarks side by side with OpenBLAS and PyTorch where installed (GEMM,
#                  tape, optimizers, elementwise functions, MLP, CNN, GPT and LSTM training),
#                  and MLP training over MPI on 2 processes against 1 where MPI is installed
#   make compare   the same benchmarks, autodiff.h against itself at REV (default HEAD~1)
#   make pair      a few training steps and a product, autodiff.h against itself at REV, both
#                  built into one program and timed alternately (PAIR_WORK picks some)
#   make pictures  examples/pictures/*.svg: tapes drawn by ad_tape_write_dot and rendered by
#                  Graphviz's dot (Debian: graphviz, needed by this target only)
#   make clean     removes build/
# The example programs are rebuilt only when their sources or autodiff.h changed.

CC ?= cc
MPICC ?= mpicc
CFLAGS ?= -O2
LDLIBS = -lm -lpthread
BUILD = build
MNIST_DIR ?= data/mnist

.PHONY: all test examples predict fuzz clean

all: examples

test:
	CC="$(CC)" bash tests/run.sh

# every example built with cc; those over MPI, which need mpicc, only when MPI is installed
MPI_EXAMPLES = $(BUILD)/mnist_mpi $(BUILD)/shakespeare_mpi
examples: $(filter-out $(MPI_EXAMPLES),$(patsubst examples/%.c,$(BUILD)/%,$(wildcard examples/*.c))) \
          $(if $(shell command -v $(MPICC) 2>/dev/null),$(MPI_EXAMPLES))

predict: $(BUILD)/predict

$(BUILD)/%: examples/%.c autodiff.h
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

clean:
	rm -rf $(BUILD)

# Fuzzing: tests/fuzz/run_libfuzzer.sh [SECONDS] [TARGET...] builds the targets with
# clang -fsanitize=fuzzer and runs them; `make test` runs only their built-in corpora.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=

fuzz:
	bash tests/fuzz/run_libfuzzer.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Benchmarks (bench/run.sh): GEMM, tape overhead, optimizer steps, elementwise functions, MLP
# and CNN epochs, training steps of a small GPT and an LSTM language model against OpenBLAS and
# PyTorch where installed, and the fused recurrent cells against their composition; prints one
# table and writes it to build/bench.md.
.PHONY: bench

bench:
	CC="$(CC)" bash bench/run.sh

# bench/compare.sh: the working tree's autodiff.h against the one at REV, alternating runs.
REV ?= HEAD~1
.PHONY: compare

compare:
	CC="$(CC)" bash bench/compare.sh $(REV)

# bench/pair.sh: the same comparison in one process, round by round (bench/pair.c).
PAIR_WORK ?=
.PHONY: pair

pair:
	CC="$(CC)" bash bench/pair.sh $(REV) $(PAIR_WORK)

# MNIST: found in MNIST_DIR, or downloaded there and checked (scripts/fetch_mnist.sh).
# Fashion-MNIST: the same files, from Debian's dataset-fashion-mnist package by default.
FASHION_DIR ?= /usr/share/datasets/fashion-mnist

.PHONY: data mnist mnist-cnn mnist-mpi fashion

# The training programs are built with plain cc and -lm only, as a user would build them.
MNIST_DEPS = examples/mnist_model.h examples/mnist_train.h examples/training_util.h autodiff.h

$(BUILD)/mnist: examples/mnist.c $(MNIST_DEPS)
	@mkdir -p $(BUILD)
	$(CC) -O2 examples/mnist.c -o $(BUILD)/mnist -lm

$(BUILD)/mnist_cnn: examples/mnist_cnn.c $(MNIST_DEPS)
	@mkdir -p $(BUILD)
	$(CC) -O2 examples/mnist_cnn.c -o $(BUILD)/mnist_cnn -lm

# The data-parallel MLP is built with MPI's compiler wrapper, the same way otherwise.
$(BUILD)/mnist_mpi: examples/mnist_mpi.c examples/data_parallel.h examples/train_group_mpi.h $(MNIST_DEPS)
	@mkdir -p $(BUILD)
	$(MPICC) -O2 examples/mnist_mpi.c -o $(BUILD)/mnist_mpi -lm

$(BUILD)/predict: examples/predict.c examples/mnist_model.h autodiff.h
	@mkdir -p $(BUILD)
	$(CC) -O2 examples/predict.c -o $(BUILD)/predict -lm

data:
	bash scripts/fetch_mnist.sh "$(MNIST_DIR)"

mnist: data $(BUILD)/mnist
	$(BUILD)/mnist --data "$(MNIST_DIR)" --checkpoint $(BUILD)/mnist.ckpt --plot $(BUILD)/mnist.svg

# scripts/mpirun.sh adds the flags that running as root, more processes than cores and Open
# MPI's choice of algorithm need, and says which.
NP ?= 2
mnist-mpi: data $(BUILD)/mnist_mpi
	bash scripts/mpirun.sh $(NP) $(BUILD)/mnist_mpi --data "$(MNIST_DIR)" --checkpoint $(BUILD)/mnist_mpi.ckpt \
	    --plot $(BUILD)/mnist_mpi.svg

mnist-cnn: data $(BUILD)/mnist_cnn
	$(BUILD)/mnist_cnn --data "$(MNIST_DIR)" --checkpoint $(BUILD)/mnist_cnn.ckpt --plot $(BUILD)/mnist_cnn.svg

fashion:
	@bash scripts/fetch_mnist.sh --check "$(FASHION_DIR)" || { \
	    echo "Fashion-MNIST is not in $(FASHION_DIR). On Debian or Ubuntu: apt-get install dataset-fashion-mnist"; \
	    echo "(it installs /usr/share/datasets/fashion-mnist), or set FASHION_DIR to a folder with its four files."; \
	    exit 1; }
	@$(MAKE) --no-print-directory $(BUILD)/mnist
	$(BUILD)/mnist --data "$(FASHION_DIR)" --fashion --checkpoint $(BUILD)/fashion.ckpt --plot $(BUILD)/fashion.svg

# Tiny Shakespeare: SHAKESPEARE_DIR, else ../shared/data/tinyshakespeare when it is there, else
# data/tinyshakespeare, downloaded and checked (scripts/fetch_shakespeare.sh).
SHAKESPEARE_DIR ?= $(if $(wildcard ../shared/data/tinyshakespeare/input.txt),../shared/data/tinyshakespeare,data/tinyshakespeare)
SHAKESPEARE_ARGS ?=
.PHONY: shakespeare shakespeare-mpi

SHAKESPEARE_DEPS = examples/shakespeare_train.h examples/char_model.h examples/training_util.h autodiff.h
$(BUILD)/shakespeare: examples/shakespeare.c $(SHAKESPEARE_DEPS)
	@mkdir -p $(BUILD)
	$(CC) -O2 examples/shakespeare.c -o $(BUILD)/shakespeare -lm

$(BUILD)/shakespeare_mpi: examples/shakespeare_mpi.c examples/data_parallel.h examples/train_group_mpi.h $(SHAKESPEARE_DEPS)
	@mkdir -p $(BUILD)
	$(MPICC) -O2 examples/shakespeare_mpi.c -o $(BUILD)/shakespeare_mpi -lm

shakespeare: $(BUILD)/shakespeare
	bash scripts/fetch_shakespeare.sh "$(SHAKESPEARE_DIR)"
	$(BUILD)/shakespeare --data "$(SHAKESPEARE_DIR)" --checkpoint $(BUILD)/shakespeare.ckpt \
	    --plot $(BUILD)/shakespeare.svg $(SHAKESPEARE_ARGS)

# the GPT data-parallel on NP processes over MPI (as mnist-mpi)
shakespeare-mpi: $(BUILD)/shakespeare_mpi
	bash scripts/fetch_shakespeare.sh "$(SHAKESPEARE_DIR)"
	bash scripts/mpirun.sh $(NP) $(BUILD)/shakespeare_mpi --data "$(SHAKESPEARE_DIR)" \
	    --checkpoint $(BUILD)/shakespeare_mpi.ckpt --plot $(BUILD)/shakespeare_mpi.svg $(SHAKESPEARE_ARGS)

# Pictures of the tape (examples/tape_pictures.c): the sigmoid and one MLP step as DOT files,
# rendered to examples/pictures/*.svg by Graphviz's dot (Debian: apt-get install graphviz); nothing else
# needs Graphviz.
.PHONY: pictures

pictures: $(BUILD)/tape_pictures
	@mkdir -p $(BUILD)/pictures examples/pictures
	$(BUILD)/tape_pictures $(BUILD)/pictures
	dot -Tsvg $(BUILD)/pictures/sigmoid.dot -o examples/pictures/sigmoid.svg
	dot -Tsvg $(BUILD)/pictures/mlp_step.dot -o examples/pictures/mlp_step.svg

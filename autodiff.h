/* autodiff.h - v0.10.30 - tape-based automatic differentiation for C - license at end

   Do this:
       #define AUTODIFF_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the implementation.
   Every other file includes it without the define and gets the declarations only.

       #define AUTODIFF_IMPLEMENTATION
       #include "autodiff.h"
       #include <stdio.h>
       int main(void) {
           ad_tape *T = ad_tape_new();
           ad_tensor *a = ad_var(T, 4), *b = ad_var(T, 3);
           ad_tensor *d = ad_mul(T, a, ad_add(T, a, b));          // d = a * (a + b)
           ad_backward(T, d);
           printf("d=%g dd/da=%g dd/db=%g\n", ad_item(d), ad_grad_item(a), ad_grad_item(b));
           ad_tape_free(T);
       }

   TABLE OF CONTENTS (each entry is a grep tag in this file)
       >>quickstart    the example above, and a training step
       >>concepts      tape, tensor, gradient, parameters
       >>options       macros you may define before including
       >>memory        who owns what, and when it is freed
       >>errors        sticky tape errors, NULL propagation
       >>threads       what may run concurrently
       >>limits        what autodiff.h does not do
       >>history       version history
       >>api           declarations, grouped as in the implementation:
                       >>api:tape >>api:tensor >>api:rng >>api:backward >>api:elementwise
                       >>api:binary >>api:numbers >>api:reduce >>api:shape >>api:index
                       >>api:linalg >>api:nn >>api:conv >>api:layers >>api:rnn >>api:attention
                       >>api:loss >>api:custom >>api:gradcheck >>api:params >>api:hooks
                       >>api:optim >>api:checkpoint >>api:data
       >>impl          implementation: >>impl:platform >>impl:arena >>impl:threads >>impl:tape
                       >>impl:tensor >>impl:rng >>impl:sweep >>impl:autograd >>impl:kernels
                       >>impl:gemm >>ops:elementwise >>ops:binary >>ops:numbers >>ops:reduce
                       >>ops:shape >>ops:index >>ops:linalg >>ops:nn >>ops:conv >>ops:pool
                       >>ops:dropout >>ops:norm >>ops:rnn >>ops:attention >>ops:embedding
                       >>ops:loss >>impl:custom >>impl:gradcheck >>impl:params >>impl:hooks
                       >>impl:optim >>impl:checkpoint >>impl:data
       >>license

   >>quickstart
   Every operation runs at once and is recorded on the tape (define-by-run). ad_backward(T, loss)
   walks the tape once, in reverse, and adds d loss / d x into x->grad for every leaf x that
   requires a gradient. ad_tape_reset(T) forgets everything recorded and rewinds the tape's
   arena in O(1) without freeing it, so a training loop does no allocation after its first step:

       ad_params *P = ad_params_new(seed);             // parameters outlive tapes
       int W1 = ad_params_add(P, "fc1.weight", 2, (int[]){784, 128}, &kaiming), ...;
       ad_optim *opt = ad_optim_new(P, &(ad_optim_desc){AD_OPTIM_ADAM, 1e-3});
       for (step = 0; step < steps; step++) {
           ad_tensor *x = ad_tensor_view(T, 2, shape, batch_pixels, NULL, 0);
           ad_tensor *h = ad_relu(T, ad_linear(T, x, ad_param(T, P, W1), ad_param(T, P, b1)));
           ad_tensor *loss = ad_cross_entropy(T, ad_linear(T, h, ad_param(T, P, W2), ...), labels);
           if (!loss) { fprintf(stderr, "%s\n", ad_tape_error(T)); break; }
           ad_params_zero_grad_on(P, T);               // on T's threads; or ad_params_zero_grad(P),
                                                        // or none with an optimizer made with zero_grad
           ad_backward(T, loss);                        // adds into P's gradient buffer
           ad_optim_step_on(opt, T);                    // or ad_optim_step(opt), one thread
           ad_tape_reset(T);
       }

   examples/mnist.c is a complete program (data loading, batches, progress, checkpoint, plot).

   >>concepts
   Tape      ad_tape: an arena of memory plus the list of operations recorded since the last reset.
             Every tensor made on a tape lives until that tape's next reset or free.
   Tensor    ad_tensor: dense, contiguous, row-major values of type ad_real with up to
             AD_MAX_DIMS dimensions (a tensor with ndim 0 is a scalar). The fields data, grad,
             size, ndim and shape are public and read-only; write into data only for leaves.
   Gradient  A tensor "requires grad" when it is a leaf made with requires_grad set (ad_var,
             ad_tensor_new(..., 1)) or the result of an op on such a tensor. Ops on tensors that
             do not require grad compute their values and record nothing.
             ad_backward accumulates into leaf->grad (allocated on the tape, or the memory you gave
             with ad_tensor_view); ad_grad returns a gradient as a new tensor and touches nothing,
             and with create_graph set the gradient is itself recorded, so it can be
             differentiated again (second derivatives, Hessian-vector products).
   Broadcast Binary ops follow NumPy: shapes are aligned at the right, and a dimension of 1 (or a
             missing one) stretches to match. Their gradients are summed back to each input's shape.
   Numbers   ad_num: a single number on a tape, a value rather than a pointer, for code that
             works on scalars (>>api:numbers): the elementwise and binary ops on numbers, and
             ad_num_backward, with a small entry per op instead of a tensor's; first order.
   Parameters ad_params: named tensors in one contiguous value buffer and one gradient buffer,
             outliving tapes; ad_param(T, P, id) puts one on a tape. Optimizers (ad_optim) and
             checkpoints work on the whole store at once.
   Modes     ad_set_grad_enabled(T, 0) records nothing (inference); ad_set_training(T, 0) puts
             dropout and batch norm into evaluation mode; ad_set_matmul_precision(T,
             AD_MATMUL_BFLOAT16) computes T's matrix products in bfloat16 (mixed precision).

   >>options
       macro                  default     define in
       AUTODIFF_IMPLEMENTATION (none)     the one file that holds the implementation
       AUTODIFF_DOUBLE        off: float  every file (ad_real becomes double)
       AUTODIFF_STATIC        off         the implementation file: all functions become static
       AUTODIFF_MALLOC(sz)    malloc      the implementation file; define all three or none
       AUTODIFF_REALLOC(p,sz) realloc
       AUTODIFF_FREE(p)       free
       AUTODIFF_ASSERT(c)     assert      internal invariants only, never user input
       AUTODIFF_NO_THREADS    off         the implementation file: no thread pool
       AUTODIFF_NO_DISPATCH   off         the implementation file: no run-time choice of
                                          AVX2/AVX-512 kernels on x86 (the compiler's default)
       AD_MAX_DIMS            8           every file
       AUTODIFF_NO_STDIO      off         the implementation file: no file functions
                                          (checkpoints from and to memory only)
       AUTODIFF_DATA_MAX_BYTES 1 GiB      the implementation file: largest file, inflated
                                          stream or decoded image the data loaders accept
       AUTODIFF_NO_DIRENT     off         the implementation file: no folder datasets
   Include <stb/stb_image.h> (Debian: libstb-dev) before autodiff.h to enable gzipped IDX files
   and image loading; everything else needs only the C standard library and libm.

   >>memory
   ad_tape_new allocates the tape; its arenas (values and tape entries in one, tensor headers
   and one-element tensors in a second, smaller one) grow by chunks (never moving data) and
   keep them across ad_tape_reset, so the steady state of a loop allocates nothing.
   ad_tape_free releases all of it. ad_tape_bytes_used and ad_tape_bytes_peak report the arena's
   use. Besides the arena a tape keeps the GEMM's packing buffers (and, once a recurrent layer
   runs, room for its packed weights), once a large product runs its worker threads, and once
   numbers are used one block for their entries (doubled as it fills, kept across resets).
   A backward sweep adds gradients straight into the buffers that leaves already have (a
   parameter store's gradients) and into buffers it made itself, so a training step needs about
   one extra copy of its activations. Parameter stores, optimizers, datasets and images are
   allocated with AUTODIFF_MALLOC and released by their _free functions.

   >>errors
   The library never aborts, exits or asserts on user input. A failing call records a message on
   its tape that names the op and the shapes, for example
       ad_matmul: [64,784] x [128,10]: inner dimensions 784 and 128 differ
   and returns NULL. The first message sticks until ad_tape_reset or ad_tape_clear_error. Every op
   given a NULL tensor returns NULL, so a chain of calls needs one check at the end. Running out
   of memory is reported the same way. A tensor lives until its tape's next reset; an op or
   ad_backward given a tensor kept from before the last reset refuses it ("x was made before
   the tape's last reset"), as it refuses a tensor of another tape. The check reads the
   tensor's header, which no new tensor reuses for several resets; keep nothing across a reset
   all the same (parameters live in an ad_params store and are put on each step's tape with
   ad_param).
   A NaN or an Inf in a result is not an error: ad_set_detect_anomaly(T, 1) makes the first op
   that produces one, forward or backward, fail with a message naming it (see >>api:hooks).

   >>threads
   There are no globals: different tapes may be used from different threads at once; one tape
   must not be used by two threads at once. Large work (matrix products, convolution batches,
   elementwise ops and reductions over large tensors, row gathers) is split over a small pool of
   POSIX threads that each tape starts on first use; plain `cc` on Linux needs no flag (glibc
   older than 2.34 needs -lpthread). ad_optim_step_on(O, T) and ad_params_zero_grad_on(P, T)
   lend the same threads to the update of a large store; ad_lbfgs_step runs its closure's ops
   on T's threads and its own vector arithmetic on the calling thread.
   ad_set_threads(T, n) sets the count; the default is the environment variable
   AUTODIFF_THREADS, else the number of online processors; ad_set_threads(T, 1) stops the
   workers, which otherwise spin for about a millisecond between jobs before they sleep.
   Results are bitwise identical for any thread count. A program that runs tapes on threads of
   its own should divide the cores between them (ad_set_threads(T, cores / its threads)).
   Define AUTODIFF_NO_THREADS to build without threads (they need GCC or Clang).

   >>limits
   No strided views (transposes are done by kernels or copies), no sparse tensors, no GPU, no
   complex numbers, no distributed training inside the header. Recurrent networks come as
   one-step LSTM and GRU cells and as one LSTM or GRU layer over a whole sequence (>>api:rnn):
   no bidirectional layers, no several layers in one call (a program stacks them), no packed
   variable-length sequences.
   Gradients flow through ad_real values only; integer inputs (class labels, embedding
   indices) are not differentiated.

   >>history
   0.1.0  2026-11-22  first release: tape, tensors, broadcasting ops, reductions, shape ops,
                      packed GEMM with threads, convolution, pooling, dropout, batch and layer
                      norm, embedding, losses, ad_backward and ad_grad with create_graph;
                      parameter store, SGD/Adam/AdamW, checkpoints, IDX/image/folder loaders.
   0.1.1  2026-11-22  speed: leaner recording and backward sweep for small tensors; convolution
                      weight gradient from an im2row matrix, cheaper im2col/col2im, a 2x2 max
                      pool path; GEMM reads thin operands in place and has a column kernel for
                      products with few columns; thread pool workers spin briefly between jobs.
   0.2.0  2026-11-22  ad_optim_step_on and ad_params_zero_grad_on: the parameter update on a
                      tape's threads; convolution batches and large row gathers split over
                      threads; one-element ops in one arena block with reused gradients; a
                      narrow GEMM kernel for products of up to one vector of columns; spinning
                      threads yield to others on an oversubscribed machine.
   0.3.0  2026-11-22  ad_optim_desc.zero_grad: the optimizer step zeroes the gradients as it
                      goes, saving a pass over the store; transposed B operands packed in
                      register-transposed 8x8 blocks (g . W^T products); large products share
                      one packed block of B across threads and balance their rows.
   0.3.1  2026-11-22  products with a small output and a long inner dimension split over
                      threads along that dimension; K blocks of equal length.
   0.3.2  2026-11-22  optimizer steps run at the machine's vector width (AVX-512 or AVX2
                      chosen at run time); Adam's square roots are vectorised; exp, log,
                      sigmoid and tanh of floats vectorised; the backward of log, sqrt, abs,
                      clamp and leaky ReLU in vectorised loops; softmax over contiguous rows
                      with the vector exp, and its backward in one pass.
   0.4.0  2026-11-22  sin and cos of floats vectorised (through doubles, 0.53 ulp); unary
                      functions, ops on two same-shaped tensors, their gradients and softmax
                      rows split over the tape's threads, and large sums, which add a long run
                      in chunks fixed by its length; gathers of long rows ask for each row's
                      first line ahead; SGD with zero_grad zeroes in its own loop.
   0.4.1  2026-11-22  max and average pooling and their gradients split over the tape's
                      threads by planes; cross-entropy keeps its softmax for the backward
                      pass; softmax and cross-entropy take the exponentials of all rows in
                      one vector call.
   0.5.0  2026-11-25  checkpoint format 2 (version 1 still read): the optimizer's zero_grad,
                      each parameter's frozen flag, and the program's own bytes
                      (ad_params_set_extra), so that training resumes exactly;
                      ad_batcher_get_state / ad_batcher_set_state; ops refuse tensors made
                      before the tape's last reset; sizes from files checked before anything
                      of that size is allocated (images probed before decoding); killed saves'
                      temporary files removed by the next save; ad_batch_norm_init takes err,
                      errlen; loader messages name the function called.
   0.6.0  2026-11-25  RMSprop (alpha, eps, momentum, centered) and Adagrad (lr_decay,
                      initial_accumulator_value) as PyTorch's; parameter groups
                      (ad_params_set_group: an lr scale, weight decay on or off) honoured by
                      every optimizer; checkpoint format 3 keeps them and the new settings
                      (formats 1 and 2 still read); ad_lbfgs: torch.optim.LBFGS with its
                      strong-Wolfe line search, over a closure that records the loss.
                      Each op defined once: unary, binary and reduction ops are rows of tables
                      (forward, derivative, split) from which the fused and recorded backward
                      are generated; typed saved state per family of ops. New ops: log1p,
                      expm1, softplus, silu, erf, atan, reciprocal, rsqrt, elu, pow_tensor,
                      min, min_axis, argmax_axis, logsumexp, var_axis, std_axis, prod_axis,
                      cumsum, squeeze, unsqueeze, stack, pad, index_select, gather, where,
                      masked_fill; NLL, L1, Huber and KL losses. ad_max passes on NaN as
                      PyTorch does.
   0.7.0  2026-11-25  autograd: ad_grads (many outputs with seeds, many inputs), ad_vjp,
                      ad_jvp, ad_jacobian, ad_hessian, ad_detach, all working inside recorded
                      sweeps; custom ops (ad_custom: a backward recorded with the library's
                      ops, or on arrays for first order); ad_gradcheck; gradient hooks,
                      ad_retain_grad and a store's gradient-complete hook; anomaly mode and
                      ad_set_name; ad_tape_write_dot; ad_item and ad_grad_item refuse tensors
                      of more than one element. Sequence models: ad_attention (fused scaled
                      dot-product attention, optional causal mask, no [T, T] matrix kept),
                      ad_lstm_cell and ad_gru_cell (fused gates).
   0.7.1  2026-11-25  speed: erf and GELU (with GELU's derivative) of floats on whole vectors;
                      ad_layer_norm is one fused entry that keeps two values per row; a
                      slice's gradient is added in place; permutes that keep the last axis
                      copy whole runs.
   0.8.0  2026-11-26  mixed precision: ad_set_matmul_precision(T, AD_MATMUL_BFLOAT16) rounds
                      the operands of every product to bfloat16 and sums in float, on AMX's
                      tiles where the processor has them and Linux grants them, else with
                      AVX512-BF16's dot products, else with float FMAs on widened halves.
   0.8.1  2026-11-26  speed: exp of floats scales by 2^n with AVX-512's scaling instruction;
                      sigmoid divides once; sin and cos are one series after a reduction by
                      odd or even multiples of pi/2 (0.52 ulp); the gradient of a sum reaches
                      the backward of unary functions and of binary ops on operands of one
                      shape as one value instead of a full tensor, and sums and shifts pass it
                      on as one value.
   0.8.2  2026-11-27  speed, scalar tapes: a plain sweep holds the gradient of a one-element
                      tensor as a value in its own table rather than as a tensor, the seed
                      included; unary functions of one element are one block per entry, like
                      binary ops, and both kinds' backward runs inside the sweep's loop;
                      names and parameters on a tape no longer keep its sweeps from holding
                      gradients as one value (a sum's, a one-element tensor's).
   0.8.3  2026-11-27  speed, GEMM: an operand read in place whose rows crowd a few L1 sets
                      (a stride of a multiple of 128 bytes or more) is packed when four or
                      more register tiles read it: the MLPs' first products and the GPT's
                      weight gradients.
   0.8.4  2026-11-27  speed, scalar tapes: in a plain sweep the gradient of every one-element
                      tensor stays a value, added from -0 (leaves with gradients of their own
                      included), and the sweep runs the one-element entries that read it in a
                      loop of their own, without the general loop's checks. Layer norm: the
                      input gradient is a vector loop (it was scalar), and the forward and
                      backward run at AVX2's width where the processor has it, without FMA,
                      so with the same bits as before.
   0.8.5  2026-11-27  ad_self_attention: multi-head attention over the heads of a fused
                      projection [B, T, 3C], read and written where they lie (the GPT
                      example's step, 1.06-1.17x); the attention kernels take any row stride.
                      speed, convolution: a weight gradient's im2row matrix and its product
                      go a band of output rows at a time, staying in L1 (its sums are split
                      at the bands, so their last bits change). GEMM: full panels of an
                      untransposed A are packed with 8 x 8 register transposes (AVX2).
   0.8.6  2026-11-27  speed, backward sweep: an elementwise unary op computes its input's
                      gradient in place over its output's (in ad_backward, where that buffer
                      is the sweep's own). AVX-512: 2x2 max pooling and its gradient sixteen
                      windows at a time, and a convolution's col2im from four channels on
                      short rows. The same bits as before; MNIST CNN step 1.12x.
   0.8.7  2026-11-27  speed, AVX-512: convolutions with stride and dilation 1 of small images
                      take the forward map and the weight gradient straight from the images,
                      without im2col's or im2row's matrix (their last bits can change);
                      MNIST CNN step 1.16x.
   0.9.0  2026-11-27  ad_num: a lean tape for single numbers beside the tensors
                      (>>api:numbers). A number is a value and its place; an op records one
                      entry of two places and two local derivatives, taken from the same
                      table rows as the tensor ops; ad_num_backward sweeps them in one pass.
                      The tutorial's f(a, b) takes half the instructions of one-element
                      tensors and 2.1-2.5x less time.
   0.9.1  2026-11-27  speed, AVX2: the GEMM micro-kernel stores its tile from a function of
                      its own, so GCC 12 keeps all twelve accumulators in registers (it kept
                      one on the stack through the loop). The same bits; on a Zen 3 products
                      1.8-2.1x, MNIST MLP epochs 1.56x and 1.93x, GPT and LSTM steps 1.83x
                      and 1.68x.
   0.9.2  2026-11-27  speed, AVX2: a B whose rows crowd L1's sets is packed only when eight
                      of the 6 x 16 kernel's tiles read it (four as before with AVX-512, and
                      for A): the LSTM's g . W is read in place. LSTM step 1.11x on a Zen 3
                      (median of 12 alternating runs).
   0.9.3  2026-11-28  speed, bfloat16 products without AVX512-BF16 or AMX (AVX2, and
                      AVX-512 without BF16): the operands are packed as floats already
                      rounded, in the dot product's order, for the float micro-kernel, in
                      place of the kernels that widened the pairs. The same bits (but for a
                      NaN's sign); on a Zen 3 products 1.1-1.7x (0.77-0.96 of float's
                      speed), large MNIST MLP epoch 1.34-1.45x (0.8 of float's).
   0.9.4  2026-11-28  speed, AVX2: an untransposed A is packed into the 6-row kernel's panels
                      through 8 x 8 register transposes (it was copied one value at a time, a
                      fifth of a 64 x 784 . 784 x 128 product's time), and bfloat16 panels of
                      six rows are rounded with vectors. The same bits; on a Zen 3 the GPT's
                      h . W_proj and g . W_fc^T 1.15-1.25x, the MLP's x . W1 1.1-1.2x, their
                      bfloat16 products 1.3-1.45x.
   0.9.5  2026-11-28  speed: a transposed A's panels are copied in pieces of constant size
                      (GCC made the loop over a panel's rows a call to memcpy per k). The
                      same bits; on a Zen 3 the weight gradients x^T . g 1.02-1.16x (the
                      MLP's 784 x 64 . 64 x 128 1.15x, the GPT's h^T . g 1.08x).
   0.9.6  2026-11-28  speed, AVX2: convolutions with stride and dilation 1 of small images
                      take the forward map and the weight gradient straight from the images,
                      as with AVX-512 since 0.8.7 (the last bits of both change on AVX2; the
                      forward's are now AVX-512's). On a Zen 3 the MNIST CNN's step
                      1.3-1.5x.
   0.10.0  2026-11-28  ad_lstm and ad_gru: one LSTM or GRU layer over a whole sequence
                       (torch.nn.LSTM and GRU with one layer), the input projection of
                       every step and the gradients of x and w_ih one product each over
                       the sequence, w_hh's two; the LSTM cell's two biases take their
                       gradient's column sums once. On a Zen 3 the 2 x 256 LSTM language
                       model's step 1.1-1.4x (medians of two runs 1.25x and 1.19x).
   0.10.1  2026-11-28  ad_lstm and ad_gru calls that are not recorded (no-grad mode, or no
                       input wanting a gradient) keep only the output and one chunk's
                       gates: the input projections go 512 rows at a time.
   0.10.2  2026-11-28  speed: the layers pack w_hh^T for the GEMM once per call, not at
                       every step (ad__gemm_prepack_bt, ad__gemm_packed), and w_ih^T once
                       when their input products go in chunks, in room the tape keeps
                       across resets. The same bits.
   0.10.3  2026-11-28  speed: ad_clip_grad_norm sums the squares in eight running sums.
   0.10.4  2026-11-28  speed: products with one to three rows of C (a recurrent layer's
                       step on one sequence, a classifier on one image) run on vector
                       kernels of their own (ad__gemm_thin), not scalar loops; with B
                       transposed each value is a dot product in 16 running sums. Their
                       last bits change.
   0.10.5  2026-11-28  speed: single numbers (ad_num). ad_num's id field is a size_t, so
                       that a float number's value travels in a floating-point register;
                       ad_num_backward marks the places it reaches with its own number
                       instead of clearing a byte per place, and skips ad_num_var's entries.
   0.10.6  2026-11-28  speed: thin products of 131,072 multiply-adds or more are split
                       over the tape's threads by columns (ad__gemm_thin_split); the same
                       bits on any thread count.
   0.10.7  2026-11-28  speed: convolutions straight from the images (AVX-512). Their input
                       planes are written by rows in loops of one load and one store, with
                       the padding rows apart; a short last block of vectors (forward map)
                       or taps (weight gradient) computes only its own instead of repeating
                       the last. The same bits.
   0.10.8  2026-11-28  speed: the same for AVX2's straight convolutions (the input planes'
                       rows in one loop, short last blocks of vectors or taps). The same
                       bits.
   0.10.9  2026-11-29  speed: an untransposed B is packed row by row (ad__pack_b_rows), each
                       row read from start to end, rather than panel by panel down B; an
                       MLP's x W1 (64 x 784 . 784 x 512) 1.08-1.09x, a GPT layer's x^T g
                       1.03-1.07x, the large MLP's step 1.03-1.05x. The same bits.
   0.10.10  2026-11-29  speed: ops as cheap as relu or an add are split over threads from 64K
                       values (was 256K): a GPT's residual adds (768 x 128) no longer run on
                       one thread; on two threads the GPT's step 1.02-1.03x, the CNN's
                       1.02x. The same bits for any thread count.
   0.10.11  2026-11-29  ad_clip_grad_norm_on: the gradient norm on a tape's threads; both clip
                       functions sum the squares in chunks fixed by the store's size. The
                       backward sweep adds up and copies gradients on the tape's threads.
   0.10.12  2026-11-29  speed: a recorded ad_gelu keeps its derivative, computed by its forward
                       with GELU itself (one exponential and one Phi for both), and the
                       backward multiplies by it (float builds with the vector functions).
                       The same bits.
   0.10.13  2026-11-29  speed: on several threads, a product of one block of rows and many
                       columns (a layer's weight gradient x^T g) packs op(A) once for all
                       threads, which then take runs of B's panels as they come, instead of
                       each packing all of A for its stripe. The same bits.
   0.10.14  2026-11-29  speed: the gradient norm's sums of squares at AVX2's width (2.2x). The
                       same bits.
   0.10.15  2026-11-29  speed: the GEMM micro-kernels' loop over K is unrolled four times; a
                       transposed A (the weight gradient x^T g) is packed four panels at a
                       time, each line of A read once. The same bits.
   0.10.16  2026-11-29  speed: a convolution's weight gradient straight from the images, with
                       AVX-512, keeps each block's sums as vectors over all chunks of a part
                       and reduces them once, and holds each output gradient vector in a
                       register for its taps. Its last bits change (another order of the sum).
                       col2im with AVX-512 keeps a block of eight channels' sums in registers
                       (the same bits).
   0.10.17  2026-11-29  speed: with bfloat16 products, convolutions of at most 64 output
                       channels go straight from the images with AVX-512 (as float ones do),
                       rounding their inputs, weights and output gradients to bfloat16 as
                       they copy them, instead of through im2col's products (the MNIST CNN's
                       bfloat16 step about twice as fast, near its float step).
   0.10.18  2026-11-29  speed: the GEMM's K blocks are as long as the core's L2 allows (an
                       MC x KC block of A in half of it, read from cpuid once), up to 512,
                       where they were 256 everywhere: 1024^3 and 2048^3 products about 3%
                       faster on Zen 4. Products with K over 256 change their last bits
                       (fewer partial sums), on machines with 576 KiB of L2 or more.
   0.10.19  2026-11-29  speed on several threads: optimizer steps, zero_grad and gradient
                       clipping cut each parameter into one band per thread (they cut the
                       whole store into equal stretches), and products with an output of up
                       to 32768 values (was 16384) split along K, so a thread updates the
                       rows of a weight it multiplied and whose gradient it computed. The
                       large MLP's SGD step on two threads of Zen 4 went from 0.151 s to
                       0.086 s an epoch; same results.
   0.10.20  2026-11-29  speed on several threads: a product with a small output (up to 32768
                       values) and B not transposed takes two K blocks where K is over 256 but
                       fits one block, so that a 512-row weight (the large MLP's second layer)
                       is split along K into the bands its update uses, not into column
                       stripes. Its SGD step on two threads of Zen 4: 0.086 s to 0.054 s an
                       epoch. Such products change their last bits on machines whose blocks
                       are longer than 256 (float on Zen 4 and Sapphire Rapids).
   0.10.21  2026-11-29  speed: with AVX-512, the input gradient of a convolution that goes
                       straight from the images, with up to 64 output channels, goes straight
                       from the output gradient too: each tap's sum over output channels is
                       added into the planes the forward map reads, and those into the input
                       gradient, without im2col's matrix and col2im. The weight gradient's full
                       vectors of inputs are loaded unmasked. A MNIST CNN epoch on one thread
                       of Zen 4: 1.69 s to 1.54-1.57 s. Its input gradients change their last
                       bits (another order of the sums).
   0.10.22  2026-11-30  speed: with AVX-512, float products of nine or ten columns with neither
                       operand transposed (a classifier's layer, x . W) spread values of k over
                       a vector's lanes instead of leaving six of sixteen lanes idle. On one
                       thread of Zen 4: h [64, 128] . W [128, 10] from 58% to 75% of the FMA
                       rate, 1000 rows of 128 1.43x faster. Such products change their last
                       bits (another order of the sums).
   0.10.23  2026-11-30  speed: with AVX-512, the float products with at most twelve columns and
                       op(A) transposed (a classifier's weight gradient, h^T . g) transpose each
                       tile of C in registers and store its rows with masked stores, instead of
                       value by value through a scratch tile. On one thread of Zen 4:
                       h^T [128, 64] . g [64, 10] from 83% to 89% of the FMA rate. Results
                       unchanged. Bfloat16 products with op(A) transposed pack A's pair panels
                       with vector stores (they went unit by unit): x^T [784, 64] . g [64, 128]
                       1.06x. With AVX512-BF16, products of at most 16 columns and 16 rows or
                       more take a tile of 16 x 16 instead of 8 x 32 (the same bits): in
                       bfloat16 h^T . g [64, 10] 1.66x, h [64, 128] . W [128, 10] 1.32x.
   0.10.24  2026-11-30  speed: with AVX-512, the spread kernel's packing of B takes its
                       permutations' indices and masks from constants (they were built value
                       by value at each call, half the packing's time) and uses two-source
                       permutations, 11 a block instead of 17. On one thread of Zen 4:
                       h [64, 128] . W [128, 10] from 75% to 80% of the FMA rate. Results
                       unchanged.
   0.10.25  2026-11-30  speed: float products with one to three columns of C and four rows or
                       more (a matrix times a vector; a linear regression's x . w and x^T . g)
                       run the thin kernels on the transposed product, on several threads when
                       large, where plain loops carried each sum through memory at 0.6 GFLOP/s.
                       On one thread of Zen 4: x [64, 784] . w [784, 1] 90x faster, a
                       regression's training step 300 us to 5.4 us. Such products change their
                       last bits (another order of the sums).
   0.10.26  2026-11-30  speed: float products of four rows and columns or more are packed from
                       128 multiply-adds on, where plain loops took them up to 8192. On one
                       thread of Zen 4, over products of 4-32 rows and columns and 4-128 values
                       of k: 1.02x the time of the faster way on average, against 3.2x. Such
                       products change their last bits.
   0.10.27  2026-11-30  speed: with AVX-512, products with op(A) transposed and at most twelve
                       columns (a layer's weight gradient h^T . g) take the narrow kernel's
                       tiles of 8 rows for a last 24 rows or fewer, which the column kernel
                       padded to its tile of 32 (the same sums, the same bits). On one thread of
                       Zen 4: h^T [100, 64] . g [64, 10] 1.49x faster, 16 rows 2.4x, 8 rows 5.2x.
   0.10.28  2026-11-30  speed: in bfloat16, products with one to three rows or columns of C run
                       the thin kernels, which round each value of the operands as they read it,
                       where packing rounded them at 5-10 GFLOP/s (now 19-25 on one thread of
                       Zen 4; a linear regression's step 3.6x faster, one image through an MLP
                       3x). In float and bfloat16, the thin kernels' last columns, fewer than a
                       vector, take a vector of B's row where plain loops chained each sum:
                       h [1, 128] . W [128, 10] 2.3 to 12 GFLOP/s. Results unchanged in float;
                       in bfloat16 such products change their last bits (another order of the
                       sums).
   0.10.29  2026-11-30  speed: the numbers' sweep keeps each place's gradient beside the number of
                       the sweep that reached it, and stores the first contribution to arrive
                       where it filled every gradient with -0 first; ad_tape_reset of a tape of
                       numbers no longer runs through the inlined rewinding of the arenas.
                       bench/tape 6.5 to 5.8 ns per op on one core of Zen 4. Results unchanged.
   0.10.30  2026-11-30  speed: the parameters' values and gradients and the optimizers' state
                       buffers start on 64-byte lines (they had the C library's 16 bytes, and
                       an SGD step with momentum took 75 or 97 us by where they fell); the
                       checkpoints' format is unchanged. On one core of Zen 4, 535,818
                       parameters: SGD 56 to 44 us, momentum 75 to 73, Adam 230 to 217.
*/
#ifndef AUTODIFF_H
#define AUTODIFF_H

#include <stddef.h>
#include <stdint.h>

#define AUTODIFF_VERSION_MAJOR 0
#define AUTODIFF_VERSION_MINOR 10
#define AUTODIFF_VERSION_PATCH 30

#ifdef AUTODIFF_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define AUTODIFF_API static __attribute__((unused))
#else
#define AUTODIFF_API static
#endif
#else
#define AUTODIFF_API extern
#endif

#ifndef AD_MAX_DIMS
#define AD_MAX_DIMS 8
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* >>api */
#ifdef AUTODIFF_DOUBLE
typedef double ad_real;
#else
typedef float ad_real;
#endif

typedef struct ad_tape ad_tape;
typedef struct ad_tensor ad_tensor;
struct ad__node;

/* A tensor. Public fields are read-only, except that you may write into data of a leaf you made.
   The fields after the comment belong to the library. */
struct ad_tensor {
    ad_real *data;              /* size values, row-major */
    ad_real *grad;              /* leaves: gradient accumulated by ad_backward, or NULL */
    size_t size;                /* number of elements: the product of shape[] (1 for a scalar) */
    int ndim;                   /* 0 (scalar) .. AD_MAX_DIMS */
    int shape[AD_MAX_DIMS];
    /* private */
    ad_tape *tape;
    struct ad__node *node;      /* the tape entry that produced it; NULL for leaves */
    ad_tensor *next_leaf;       /* the tape's list of leaves that require grad */
    unsigned id;                /* index of this tensor on its tape, for the backward sweep */
    unsigned short gen;         /* the tape's generation (count of resets) when it was made */
    unsigned char requires_grad;
    unsigned char grad_is_external; /* grad points at memory the tape does not own */
};

/* Portable random numbers (xoshiro256**): the same seed gives the same sequence everywhere. */
typedef struct ad_rng { uint64_t s[4]; } ad_rng;

/* >>api:tape -------------------------------------------------------------------------------- */

/* A new, empty tape. Returns NULL only when memory runs out. */
AUTODIFF_API ad_tape *ad_tape_new(void);
/* Frees the tape, its arena and every tensor made on it. NULL is allowed. */
AUTODIFF_API void ad_tape_free(ad_tape *T);
/* Forgets every tensor and entry and clears the error; O(1), keeps the arena's memory. */
AUTODIFF_API void ad_tape_reset(ad_tape *T);
/* The first error recorded since the last reset, or NULL while there is none. */
AUTODIFF_API const char *ad_tape_error(const ad_tape *T);
/* Clears the error so that the tape can be used on. */
AUTODIFF_API void ad_tape_clear_error(ad_tape *T);
/* Turns recording on (1, the default) or off (0: no-grad mode for inference: ops compute values,
   record nothing, and their results do not require grad). Returns the previous setting. */
AUTODIFF_API int ad_set_grad_enabled(ad_tape *T, int enabled);
/* Training (1) or evaluation (0, the default is 1) mode, read by ops that behave differently in
   the two (dropout, batch norm). Returns the previous setting. */
AUTODIFF_API int ad_set_training(ad_tape *T, int training);
AUTODIFF_API int ad_is_training(const ad_tape *T);
/* Bytes of the arena in use now, and the most in use since the tape was made. */
AUTODIFF_API size_t ad_tape_bytes_used(const ad_tape *T);
AUTODIFF_API size_t ad_tape_bytes_peak(const ad_tape *T);
/* Number of entries recorded since the last reset. */
AUTODIFF_API size_t ad_tape_length(const ad_tape *T);
/* Threads that the tape's large kernels (matrix products) may use, counting the caller.
   0 restores the default: the environment variable AUTODIFF_THREADS when set, else the number
   of online processors. 1 runs everything on the calling thread. Results are bitwise the same
   for every count. Workers are started on first use and stopped by ad_tape_free; a program
   that runs several tapes on threads of its own should give each tape its share of the cores. */
AUTODIFF_API void ad_set_threads(ad_tape *T, int nthreads);
AUTODIFF_API int ad_get_threads(const ad_tape *T);
/* How T's matrix products compute. AD_MATMUL_FLOAT32 (the default): in ad_real.
   AD_MATMUL_BFLOAT16: mixed precision, as PyTorch's autocast to bfloat16 does it for products.
   Both operands of every product (ad_matmul, ad_matmul_t, ad_linear, the convolutions, the
   recurrent cells, the attention's two products, and the products of their gradients) are rounded
   to bfloat16 (8 significant bits, to nearest even) and the products are summed in float, on AMX's
   tiles where the processor has them (Intel Xeon from Sapphire Rapids on; the call asks Linux for
   the tiles' state, which a process must do once), else with AVX512-BF16's dot-product
   instruction, else with the same rounding and the float products' multiply-adds (there somewhat
   slower than float products, for the rounding). Convolutions with at most 64 output channels,
   whose products would fill little of a tile, take the float multiply-adds on rounded operands
   wherever the processor has AVX-512. Parameters, gradients, optimizer state and every
   other op stay in float. A product's result is that of its operands rounded, within about 2^-8 of
   each term of the float result; with AMX, large products are several times as fast as in float
   (README has figures). Results stay bitwise the same for any thread count. Returns the previous
   setting, or -1 with T's error set for an unknown precision, or for AD_MATMUL_BFLOAT16 in a build
   with AUTODIFF_DOUBLE, which keeps its products in double. */
enum { AD_MATMUL_FLOAT32 = 0, AD_MATMUL_BFLOAT16 = 1 };
AUTODIFF_API int ad_set_matmul_precision(ad_tape *T, int precision);
AUTODIFF_API int ad_get_matmul_precision(const ad_tape *T);

/* >>api:tensor ------------------------------------------------------------------------------ */

/* A one-element leaf (ndim 0) that requires grad. */
AUTODIFF_API ad_tensor *ad_var(ad_tape *T, ad_real value);
/* A one-element constant (ndim 0): no gradient. */
AUTODIFF_API ad_tensor *ad_scalar(ad_tape *T, ad_real value);
/* A leaf with the given shape: values copied from data, or zeros when data is NULL. */
AUTODIFF_API ad_tensor *ad_tensor_new(ad_tape *T, int ndim, const int *shape, const ad_real *data,
                                      int requires_grad);
/* A leaf whose values are the caller's memory (not copied; it must outlive the tape's use of
   the tensor). If grad is not NULL and requires_grad is set, ad_backward adds the gradient into
   grad (size values); the library never clears it. Parameters use this. */
AUTODIFF_API ad_tensor *ad_tensor_view(ad_tape *T, int ndim, const int *shape, ad_real *data,
                                       ad_real *grad, int requires_grad);
AUTODIFF_API ad_tensor *ad_zeros(ad_tape *T, int ndim, const int *shape);
AUTODIFF_API ad_tensor *ad_ones(ad_tape *T, int ndim, const int *shape);
AUTODIFF_API ad_tensor *ad_full(ad_tape *T, int ndim, const int *shape, ad_real value);
/* Uniform in [lo, hi) and normal(mean, std) leaves from rng; no gradient. */
AUTODIFF_API ad_tensor *ad_rand(ad_tape *T, int ndim, const int *shape, ad_real lo, ad_real hi,
                                ad_rng *rng);
AUTODIFF_API ad_tensor *ad_randn(ad_tape *T, int ndim, const int *shape, ad_real mean, ad_real std,
                                 ad_rng *rng);
/* Marks a leaf as requiring grad (or not). Has no effect on results of ops. */
AUTODIFF_API void ad_set_requires_grad(ad_tensor *x, int requires_grad);
/* Value and gradient of a one-element tensor (0 for NULL; gradient 0 when none was computed).
   A tensor of more than one element gives 0 and an error on its tape (PyTorch's item() raises);
   read its data or grad array instead. */
AUTODIFF_API ad_real ad_item(const ad_tensor *x);
AUTODIFF_API ad_real ad_grad_item(const ad_tensor *x);
/* Writes shape as "[2,3,4]" into buf (always terminated). Returns buf. */
AUTODIFF_API char *ad_shape_str(const ad_tensor *x, char *buf, size_t cap);

/* Convenience for C (not C++): AD_SHAPE(2,3) expands to the pair 2, (const int[]){2,3}. */
#define AD_SHAPE(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (const int[]){__VA_ARGS__}

/* >>api:rng --------------------------------------------------------------------------------- */
AUTODIFF_API void ad_rng_seed(ad_rng *rng, uint64_t seed);
AUTODIFF_API uint64_t ad_rng_next(ad_rng *rng);
/* Uniform integer in [0, n) without modulo bias; 0 when n is 0. */
AUTODIFF_API uint64_t ad_rng_below(ad_rng *rng, uint64_t n);
/* Uniform double in [0, 1) with 53 random bits. */
AUTODIFF_API double ad_rng_uniform(ad_rng *rng);
/* Standard normal (Box-Muller). */
AUTODIFF_API double ad_rng_normal(ad_rng *rng);

/* >>api:backward ---------------------------------------------------------------------------- */
/* Adds d y / d x into x->grad for every leaf x on the tape that requires grad and that y depends
   on (x->grad is allocated and zeroed on the tape first if it is NULL). y must have one element.
   Returns 0, or -1 with the tape's error set. */
AUTODIFF_API int ad_backward(ad_tape *T, ad_tensor *y);
/* d y / d x as a new tensor of x's shape (zeros when y does not depend on x), without touching
   any grad field. y must have one element. With create_graph non-zero the result is recorded on
   the tape and can be differentiated again. Returns NULL on error. */
AUTODIFF_API ad_tensor *ad_grad(ad_tape *T, ad_tensor *y, ad_tensor *x, int create_graph);

/* The functions below are torch.autograd's grad, vjp, jvp, jacobian and hessian on tensors
   already computed on the tape (PyTorch's functional forms take a function instead). Each
   sweeps the tape as ad_grad does, writes no grad field, and returns new tensors on the tape.
   With create_graph non-zero every result is itself recorded, so the helpers compose: ad_jvp
   of an ad_vjp, ad_hessian of a function that calls ad_grad(..., 1), ad_jacobian of a gradient
   are exact. They work in no-grad mode too (the sweeps record what they need). Where they differ
   from PyTorch:
   - an input with no route from the outputs, or one that does not require grad, gets zeros of
     its shape (torch.autograd.grad raises, or gives None with allow_unused; this is its
     materialize_grads=True); an output that does not require grad contributes nothing;
   - a seed (grad_ys[i], v, u) must have exactly the shape of what it seeds (one-element shapes
     are interchangeable: [] and [1, 1] both seed a scalar); nothing is broadcast;
   - a one-element y counts as shape [] in ad_jacobian (PyTorch keeps y's shape: [1] ++ x.shape);
   - nothing is freed by a sweep, so there is no retain_graph: the tape may be swept again.
   Errors name the function and the shapes, set the tape's error and return NULL (-1 for
   ad_grads); a NULL tensor argument is an error too (an earlier op failed). One tape, one
   thread, as for every op. */

/* For each xs[j]: d/d xs[j] of sum_i <grad_ys[i], ys[i]>, written into out[j] (shape of xs[j];
   zeros where there is no route), all from one sweep. grad_ys may be NULL, and any entry may be
   NULL, meaning ones for a one-element ys[i] (an error for a larger one). create_graph as in
   ad_grad; with it the results are differentiable in grad_ys too. ny and nx are at least 1.
   Returns 0, or -1 with the tape's error set and every out[j] NULL. */
AUTODIFF_API int ad_grads(ad_tape *T, int ny, ad_tensor *const *ys, ad_tensor *const *grad_ys,
                          int nx, ad_tensor *const *xs, ad_tensor **out, int create_graph);
/* v^T J, the vector-Jacobian product (J = d y / d x): the shape of x, one sweep. v has the shape
   of y; NULL means ones, for a one-element y only (torch.autograd.functional.vjp's rule). */
AUTODIFF_API ad_tensor *ad_vjp(ad_tape *T, ad_tensor *y, ad_tensor *x, ad_tensor *v, int create_graph);
/* J u, the Jacobian-vector product (forward mode): the shape of y. u has the shape of x; NULL
   means ones, for a one-element x only. Costs about one recorded sweep and one more sweep
   through it (g(w) = w^T J is recorded for a dummy w, then J u = d/dw <g(w), u>), not one
   sweep per element. */
AUTODIFF_API ad_tensor *ad_jvp(ad_tape *T, ad_tensor *y, ad_tensor *x, ad_tensor *u, int create_graph);
/* d y / d x with shape y.shape ++ x.shape (a one-element y counts as shape []), element
   [i..., j...] = d y[i...] / d x[j...]. Takes min(y->size, x->size) sweeps: one per element of
   y (reverse mode) when y is the smaller, else one recorded sweep and then one per element of x
   through what it recorded (forward mode); a one-element y or x takes one. The result must fit
   in AD_MAX_DIMS dimensions. */
AUTODIFF_API ad_tensor *ad_jacobian(ad_tape *T, ad_tensor *y, ad_tensor *x, int create_graph);
/* Second derivatives of a one-element y: shape x.shape ++ x.shape (also for a one-element x of
   shape [1]: [1, 1]), the Jacobian of the recorded gradient: x->size + 1 sweeps. */
AUTODIFF_API ad_tensor *ad_hessian(ad_tape *T, ad_tensor *y, ad_tensor *x, int create_graph);
/* The same values, cut from the graph: a leaf that does not require grad, so no gradient flows
   through it. As in PyTorch it shares x's memory (no copy): a write into one is seen in the
   other, and in x's gradient where x's backward reads its values. */
AUTODIFF_API ad_tensor *ad_detach(ad_tape *T, ad_tensor *x);

/* >>api:elementwise ------------------------------------------------------------------------- */
AUTODIFF_API ad_tensor *ad_neg(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_exp(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_log(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_sin(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_cos(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_tanh(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_sigmoid(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_relu(ad_tape *T, ad_tensor *a);
/* x for x > 0, slope * x otherwise. */
AUTODIFF_API ad_tensor *ad_leaky_relu(ad_tape *T, ad_tensor *a, ad_real slope);
/* x * Phi(x) with the exact normal CDF (erf), as PyTorch's default. When recorded in a float
   build with the vector functions, the forward also keeps the derivative of every value on the
   tape (one more value per element) for the backward. */
AUTODIFF_API ad_tensor *ad_gelu(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_sqrt(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_abs(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_square(ad_tape *T, ad_tensor *a);
/* x^p for a constant p. */
AUTODIFF_API ad_tensor *ad_pow(ad_tape *T, ad_tensor *a, ad_real p);
/* log(1 + x) and e^x - 1, accurate near 0. */
AUTODIFF_API ad_tensor *ad_log1p(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_expm1(ad_tape *T, ad_tensor *a);
/* log(1 + e^x), without overflow for any x (PyTorch's softplus with beta 1 and no threshold). */
AUTODIFF_API ad_tensor *ad_softplus(ad_tape *T, ad_tensor *a);
/* x * sigmoid(x) (SiLU, swish). */
AUTODIFF_API ad_tensor *ad_silu(ad_tape *T, ad_tensor *a);
/* The error function, and the arctangent. */
AUTODIFF_API ad_tensor *ad_erf(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_atan(ad_tape *T, ad_tensor *a);
/* 1 / x, and 1 / sqrt(x). */
AUTODIFF_API ad_tensor *ad_reciprocal(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_rsqrt(ad_tape *T, ad_tensor *a);
/* x for x > 0, alpha (e^x - 1) otherwise (alpha 1 is PyTorch's default). */
AUTODIFF_API ad_tensor *ad_elu(ad_tape *T, ad_tensor *a, ad_real alpha);
/* min(max(x, lo), hi); the gradient is 1 inside [lo, hi] and 0 outside. */
AUTODIFF_API ad_tensor *ad_clamp(ad_tape *T, ad_tensor *a, ad_real lo, ad_real hi);
/* scale * x + shift: the scalar forms below are all this one op. */
AUTODIFF_API ad_tensor *ad_affine(ad_tape *T, ad_tensor *a, ad_real scale, ad_real shift);
AUTODIFF_API ad_tensor *ad_add_scalar(ad_tape *T, ad_tensor *a, ad_real s);
AUTODIFF_API ad_tensor *ad_sub_scalar(ad_tape *T, ad_tensor *a, ad_real s);   /* a - s */
AUTODIFF_API ad_tensor *ad_rsub_scalar(ad_tape *T, ad_real s, ad_tensor *a);  /* s - a */
AUTODIFF_API ad_tensor *ad_mul_scalar(ad_tape *T, ad_tensor *a, ad_real s);
AUTODIFF_API ad_tensor *ad_div_scalar(ad_tape *T, ad_tensor *a, ad_real s);   /* a / s */
AUTODIFF_API ad_tensor *ad_maximum_scalar(ad_tape *T, ad_tensor *a, ad_real s);
AUTODIFF_API ad_tensor *ad_minimum_scalar(ad_tape *T, ad_tensor *a, ad_real s);

/* >>api:binary: NumPy broadcasting; the gradient is summed back to each input's shape ------- */
AUTODIFF_API ad_tensor *ad_add(ad_tape *T, ad_tensor *a, ad_tensor *b);
AUTODIFF_API ad_tensor *ad_sub(ad_tape *T, ad_tensor *a, ad_tensor *b);
AUTODIFF_API ad_tensor *ad_mul(ad_tape *T, ad_tensor *a, ad_tensor *b);
AUTODIFF_API ad_tensor *ad_div(ad_tape *T, ad_tensor *a, ad_tensor *b);
/* Elementwise max / min; at ties the gradient is split evenly between a and b. */
AUTODIFF_API ad_tensor *ad_maximum(ad_tape *T, ad_tensor *a, ad_tensor *b);
AUTODIFF_API ad_tensor *ad_minimum(ad_tape *T, ad_tensor *a, ad_tensor *b);
/* a^b elementwise. A negative base with an exponent that is not a whole number gives NaN. The
   gradient with respect to b is g a^b log a, taken as 0 where a is 0 (PyTorch's choice where
   b >= 0; where b < 0 the value is infinite anyway). */
AUTODIFF_API ad_tensor *ad_pow_tensor(ad_tape *T, ad_tensor *a, ad_tensor *b);

/* >>api:numbers: a lean tape for functions of single numbers ------------------------------------
   For code that works on single numbers (the tutorial's f(a, b), a small model fitted by hand),
   one-element tensors carry a tensor's header and a general tape entry per op. An ad_num is a
   value, not a pointer: the number and its place on the tape. An op on numbers writes one small
   entry (the places of its inputs and its local derivatives, taken as it runs), and
   ad_num_backward multiplies them along every route and adds the routes in one pass. The ops are
   the rows of the elementwise and binary tables, with the same formulas for the value and the
   derivative; first order only (for second derivatives use one-element tensors, ad_var, with
   ad_grad's create_graph). Where they differ from the tensor ops:
   - a local derivative is taken before the incoming gradient multiplies it, so where it
     overflows (d(a/b)/db = -a/b^2 for a tiny b) the gradient is infinite even when the tensors',
     which take the gradient into the formula first, is not;
   - in float builds the tensors' exp, log, sin, cos, tanh, sigmoid and GELU run on vectors, and
     the numbers' on the C library, so their last bits can differ;
   - anomaly mode does not watch numbers (a NaN is a value; ad_num_ok tells a failure).
   An op whose inputs are all constants, or any op in no-grad mode (ad_set_grad_enabled),
   records nothing and gives a constant.
   Numbers live on a tape, beside its tensors, until ad_tape_reset. Errors follow the tape's
   rules: the first is recorded on the tape, the failing call returns a failed number (value
   NaN, ad_num_ok 0), and every op given one returns one, so a chain needs one check at the
   end. A number kept from before the tape's last reset, or one of another tape, is refused:
   the check compares its place with the range of places the tape gives out now, which moves on
   at every reset and starts at a different point on every tape. So a number of another tape
   passes only if the two ranges happen to meet, and a stale one only after about 2^31 numbers,
   when the places start again. */
typedef struct ad_num {
    ad_real value;
    size_t id;                   /* private: its place on the tape (only 32 bits are used; a wider
                                    field keeps a float's value alone in the first eight bytes, so
                                    that calls pass it in a floating-point register) */
} ad_num;

/* A number that ad_num_backward differentiates against, and a constant (no gradient). */
AUTODIFF_API ad_num ad_num_var(ad_tape *T, ad_real value);
AUTODIFF_API ad_num ad_num_const(ad_tape *T, ad_real value);
/* 0 for a failed number (the result of a call that failed or was given one), else 1. A NaN
   value alone is not a failure: ad_num_log of -1 is NaN and ok. */
AUTODIFF_API int ad_num_ok(ad_num x);
AUTODIFF_API ad_num ad_num_add(ad_tape *T, ad_num a, ad_num b);
AUTODIFF_API ad_num ad_num_sub(ad_tape *T, ad_num a, ad_num b);
AUTODIFF_API ad_num ad_num_mul(ad_tape *T, ad_num a, ad_num b);
AUTODIFF_API ad_num ad_num_div(ad_tape *T, ad_num a, ad_num b);
/* the larger and the smaller; at ties the gradient is split evenly */
AUTODIFF_API ad_num ad_num_maximum(ad_tape *T, ad_num a, ad_num b);
AUTODIFF_API ad_num ad_num_minimum(ad_tape *T, ad_num a, ad_num b);
/* a^b; its derivative in b is a^b log a, taken as 0 where a is 0 (as ad_pow_tensor) */
AUTODIFF_API ad_num ad_num_pow_num(ad_tape *T, ad_num a, ad_num b);
/* the functions of >>api:elementwise, with their parameters */
AUTODIFF_API ad_num ad_num_neg(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_exp(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_log(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_sin(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_cos(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_tanh(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_sigmoid(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_relu(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_leaky_relu(ad_tape *T, ad_num x, ad_real slope);
AUTODIFF_API ad_num ad_num_gelu(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_sqrt(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_abs(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_square(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_pow(ad_tape *T, ad_num x, ad_real p);
AUTODIFF_API ad_num ad_num_clamp(ad_tape *T, ad_num x, ad_real lo, ad_real hi);
AUTODIFF_API ad_num ad_num_affine(ad_tape *T, ad_num x, ad_real scale, ad_real shift);
AUTODIFF_API ad_num ad_num_log1p(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_expm1(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_softplus(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_silu(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_erf(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_atan(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_reciprocal(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_rsqrt(ad_tape *T, ad_num x);
AUTODIFF_API ad_num ad_num_elu(ad_tape *T, ad_num x, ad_real alpha);
/* d y / d x for every number x recorded on the tape before y, kept until the next
   ad_num_backward or reset. Returns 0, or -1 with the tape's error set. */
AUTODIFF_API int ad_num_backward(ad_tape *T, ad_num y);
/* d y / d x from the last ad_num_backward: 0 where y does not depend on x (a constant, a number
   made after y). A number that is not on the tape gives NaN and the tape's error. */
AUTODIFF_API ad_real ad_num_grad(ad_tape *T, ad_num x);
/* The numbers recorded on the tape since its last reset: ad_num_var's and the ops'. */
AUTODIFF_API size_t ad_num_count(const ad_tape *T);

/* >>api:reduce: axis may be negative (-1 is the last); keepdim keeps the axis with size 1 ---- */
AUTODIFF_API ad_tensor *ad_sum(ad_tape *T, ad_tensor *a);     /* over everything: a scalar */
AUTODIFF_API ad_tensor *ad_mean(ad_tape *T, ad_tensor *a);
/* Largest element; the gradient goes to the first position holding it. A NaN counts as
   larger than every number and the first NaN is returned, as in PyTorch. */
AUTODIFF_API ad_tensor *ad_max(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_sum_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim);
AUTODIFF_API ad_tensor *ad_mean_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim);
AUTODIFF_API ad_tensor *ad_max_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim);
/* Smallest element; the gradient goes to the first position holding it. A NaN counts as
   smaller than every number and the first NaN is returned, as in PyTorch. */
AUTODIFF_API ad_tensor *ad_min(ad_tape *T, ad_tensor *a);
AUTODIFF_API ad_tensor *ad_min_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim);
/* log(sum(exp(a))) along axis, computed as m + log(sum(exp(a - m))) with m the largest value of
   each slice, so it is finite wherever the result is (inputs of 1e300 and -1e300 included); a
   slice whose largest value is infinite gives that infinity, a NaN gives NaN. The gradient is
   softmax(a) along axis. */
AUTODIFF_API ad_tensor *ad_logsumexp(ad_tape *T, ad_tensor *a, int axis, int keepdim);
/* Variance along axis, sum((a - mean)^2) / (N - correction) with N the axis's length, as
   PyTorch's var(dim, correction=...): 1 gives the unbiased estimate, 0 the mean square
   deviation. Where N - correction <= 0 the result is infinite or NaN (PyTorch warns and gives
   the same). */
AUTODIFF_API ad_tensor *ad_var_axis(ad_tape *T, ad_tensor *a, int axis, int correction, int keepdim);
/* The square root of ad_var_axis. Its gradient is NaN where the result is 0, as PyTorch's. */
AUTODIFF_API ad_tensor *ad_std_axis(ad_tape *T, ad_tensor *a, int axis, int correction, int keepdim);
/* Product along axis. The gradient of an element is the product of the others of its slice,
   taken without dividing, so it is right for slices that hold one zero or several. Recorded for
   create_graph, that derivative is a product over an [N, N] arrangement of each slice of length
   N, so a higher derivative needs N times the memory of the one before. */
AUTODIFF_API ad_tensor *ad_prod_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim);
/* Running sum along axis, a's shape: y[.., j, ..] = a[.., 0, ..] + ... + a[.., j, ..]. */
AUTODIFF_API ad_tensor *ad_cumsum(ad_tape *T, ad_tensor *a, int axis);
/* The position along axis of the largest element, for every position of the other axes, written
   row-major into out (a's shape without axis: a->size / a->shape[axis] ints). Ties go to the
   first position; a NaN counts as the largest, and the first NaN is taken (PyTorch's argmax).
   Records nothing. Returns 0, or -1 when a is NULL (no message), or with the error on a's tape
   when out is NULL, axis is out of range (a scalar has no axis) or a is stale. */
AUTODIFF_API int ad_argmax_axis(const ad_tensor *a, int axis, int *out);

/* >>api:shape ------------------------------------------------------------------------------- */
/* Same values, new shape (a view: no copy). One entry of shape may be -1: it is inferred. */
AUTODIFF_API ad_tensor *ad_reshape(ad_tape *T, ad_tensor *a, int ndim, const int *shape);
/* [N, d1, d2, ...] -> [N, d1*d2*...] */
AUTODIFF_API ad_tensor *ad_flatten(ad_tape *T, ad_tensor *a);
/* Swaps two axes (copies). */
AUTODIFF_API ad_tensor *ad_transpose(ad_tape *T, ad_tensor *a, int axis0, int axis1);
/* Output axis i is input axis perm[i] (copies). */
AUTODIFF_API ad_tensor *ad_permute(ad_tape *T, ad_tensor *a, const int *perm);
/* Joins n tensors along axis; all other dimensions must agree. */
AUTODIFF_API ad_tensor *ad_concat(ad_tape *T, ad_tensor *const *xs, int n, int axis);
/* Elements start..end-1 along axis (negative start/end count from the end). */
AUTODIFF_API ad_tensor *ad_slice(ad_tape *T, ad_tensor *a, int axis, int start, int end);
/* Broadcasts a to shape (NumPy rules). */
AUTODIFF_API ad_tensor *ad_broadcast_to(ad_tape *T, ad_tensor *a, int ndim, const int *shape);
/* Sums a down to shape, the reverse of broadcasting (shape must broadcast to a's shape). */
AUTODIFF_API ad_tensor *ad_sum_to(ad_tape *T, ad_tensor *a, int ndim, const int *shape);
/* Removes axis when its size is 1 (a view). As PyTorch's squeeze(dim), an axis of another size
   leaves a as it is: a itself is returned. A scalar accepts axis 0 or -1 and is returned. */
AUTODIFF_API ad_tensor *ad_squeeze(ad_tape *T, ad_tensor *a, int axis);
/* Inserts an axis of size 1 (a view) so that it is axis axis of the result: 0..ndim, or negative
   counting from the result's end (-1 makes it the new last axis). */
AUTODIFF_API ad_tensor *ad_unsqueeze(ad_tape *T, ad_tensor *a, int axis);
/* Joins n tensors of one shape along a new axis, placed as ad_unsqueeze places it: stacking n
   tensors [3, 4] along 1 gives [3, n, 4]. NULL entries give NULL. */
AUTODIFF_API ad_tensor *ad_stack(ad_tape *T, ad_tensor *const *xs, int n, int axis);
/* Pads a with value, as the constant mode of PyTorch's F.pad: pads holds npads / 2 pairs
   (before, after), the first for the last axis, the next for the axis before it, and so on;
   npads is even and at most 2 ndim (pads may be NULL when npads is 0). Negative amounts cut
   values off, as in PyTorch; every resulting dimension must be at least 1. pads is copied. The
   gradient is the same padding taken back (g cut to a's place, zeros where a was cut off). */
AUTODIFF_API ad_tensor *ad_pad(ad_tape *T, ad_tensor *a, int npads, const int *pads, ad_real value);

/* >>api:index: picking elements by position or by a mask ------------------------------------ */
/* The slices index[0..n-1] of a along axis (PyTorch's index_select): a's shape with n at axis.
   The indices are copied; each is in 0..a->shape[axis]-1 (no negative ones, as in PyTorch). A
   slice picked twice gets the sum of both gradients. */
AUTODIFF_API ad_tensor *ad_index_select(ad_tape *T, ad_tensor *a, int axis, const int *index, int n);
/* torch.gather: index holds, row-major, one position along axis for every element of the result,
   whose shape (ndim, shape) it has; for axis 1 of a 3-D a, y[i][j][k] = a[i][index[i][j][k]][k].
   ndim must be a's; along the other axes shape may be smaller than a's, never larger. index is
   copied, its values are in 0..a->shape[axis]-1, and repeated positions add their gradients. */
AUTODIFF_API ad_tensor *ad_gather(ad_tape *T, ad_tensor *a, int axis, const int *index, int ndim,
                                  const int *shape);
/* a where cond is non-zero, b elsewhere; cond, a and b broadcast together (NumPy rules). cond is
   a mask and gets no gradient; a and b get the output's gradient where they were chosen (0
   elsewhere, without multiplying, so an infinite branch does not turn the gradient to NaN),
   summed back to their shapes. */
AUTODIFF_API ad_tensor *ad_where(ad_tape *T, ad_tensor *cond, ad_tensor *a, ad_tensor *b);
/* a with value wherever mask, broadcast to a's shape, is non-zero; a's gradient is 0 there. */
AUTODIFF_API ad_tensor *ad_masked_fill(ad_tape *T, ad_tensor *a, ad_tensor *mask, ad_real value);

/* >>api:linalg ------------------------------------------------------------------------------ */
/* Matrix product of the last two axes. 2-D x 2-D, or batched: [..., m, k] x [..., k, n] with
   equal batch axes, or one side 2-D and shared across the other's batch. */
AUTODIFF_API ad_tensor *ad_matmul(ad_tape *T, ad_tensor *a, ad_tensor *b);
/* The same with either operand transposed in its last two axes (by the GEMM, without a copy). */
AUTODIFF_API ad_tensor *ad_matmul_t(ad_tape *T, ad_tensor *a, ad_tensor *b, int trans_a,
                                    int trans_b);
/* x [..., in] . W [in, out] + b [out]; b may be NULL. */
AUTODIFF_API ad_tensor *ad_linear(ad_tape *T, ad_tensor *x, ad_tensor *W, ad_tensor *b);

/* >>api:nn ---------------------------------------------------------------------------------- */
/* Numerically stable softmax and log-softmax along axis. */
AUTODIFF_API ad_tensor *ad_softmax(ad_tape *T, ad_tensor *a, int axis);
AUTODIFF_API ad_tensor *ad_log_softmax(ad_tape *T, ad_tensor *a, int axis);

/* >>api:conv: convolution and pooling on NCHW tensors ---------------------------------------- */

/* Options of ad_conv2d. Valid when zero-initialised: 0 selects the default of each field. */
typedef struct ad_conv2d_desc {
    int stride_h, stride_w;     /* step between windows; 0: 1 */
    int pad_h, pad_w;           /* zeros added on each side of the input; 0: none */
    int dilation_h, dilation_w; /* spacing of the kernel's taps; 0: 1 */
    int groups;                 /* channel groups, each convolved on its own; 0: 1 */
} ad_conv2d_desc;

/* 2-D convolution (cross-correlation, as PyTorch's conv2d) of x [N, C, H, W] with the kernels
   w [O, C / groups, kH, kW], plus b [O] for each output channel (b may be NULL). The result is
   [N, O, Ho, Wo] with Ho = (H + 2 pad_h - dilation_h (kH - 1) - 1) / stride_h + 1 (rounded
   down), likewise Wo. desc may be NULL for all defaults. Its gradients, and their gradients,
   are convolutions again, so any order of derivative is available. Returns NULL (with the
   tape's error naming ad_conv2d and the shapes) for bad ranks, channels that groups does not
   divide, a w whose second dimension is not C / groups, a b that is not [O], negative stride,
   padding or dilation, and a kernel that is larger than the padded input. */
AUTODIFF_API ad_tensor *ad_conv2d(ad_tape *T, ad_tensor *x, ad_tensor *w, ad_tensor *b,
                                  const ad_conv2d_desc *desc);

/* Options of the pooling ops. Valid when zero-initialised. */
typedef struct ad_pool2d_desc {
    int stride_h, stride_w; /* 0: the kernel size (windows side by side) */
    int pad_h, pad_w;       /* padding on each side, at most half the kernel; 0: none */
    int exclude_pad;        /* ad_avg_pool2d: 0 divides every window by kH * kW, padded cells
                               included (PyTorch's count_include_pad=True); 1 divides by the
                               number of cells inside the input */
} ad_pool2d_desc;

/* Maximum over kH x kW windows of x [N, C, H, W]: [N, C, Ho, Wo] with
   Ho = (H + 2 pad_h - kH) / stride_h + 1. Padded cells never win. The gradient goes to the
   first maximal cell of each window (row-major order); where windows overlap, it adds up.
   desc may be NULL. Returns NULL for a bad rank, a kernel or stride below 1, padding outside
   0..kernel/2, or a kernel larger than the padded input. */
AUTODIFF_API ad_tensor *ad_max_pool2d(ad_tape *T, ad_tensor *x, int kernel_h, int kernel_w,
                                      const ad_pool2d_desc *desc);
/* Mean over kH x kW windows of x [N, C, H, W]; the shapes and errors are as ad_max_pool2d's. */
AUTODIFF_API ad_tensor *ad_avg_pool2d(ad_tape *T, ad_tensor *x, int kernel_h, int kernel_w,
                                      const ad_pool2d_desc *desc);
/* Mean over H and W: [N, C, H, W] -> [N, C]. NULL unless x has 4 dimensions. */
AUTODIFF_API ad_tensor *ad_global_avg_pool2d(ad_tape *T, ad_tensor *x);

/* >>api:layers: dropout, normalisation, embedding ------------------------------------------- */

/* In training mode (ad_is_training), x times a mask that is 0 with probability p and
   1 / (1 - p) otherwise (so the expected value is x), drawn from rng; p = 1 gives zeros. In
   evaluation mode, or with p = 0, returns x itself and records nothing (rng may then be NULL).
   The mask is a constant, so the gradient is g times the same mask. Returns NULL when p is
   outside [0, 1] or rng is NULL in training mode. */
AUTODIFF_API ad_tensor *ad_dropout(ad_tape *T, ad_tensor *x, ad_real p, ad_rng *rng);

/* The running statistics of a batch norm layer with num_features channels. Set up with
   ad_batch_norm_init; momentum and eps may be changed afterwards. Not shared between threads
   that run in training mode at the same time (training updates it). */
typedef struct ad_batch_norm_state {
    int num_features;
    ad_real *running_mean;      /* [num_features] */
    ad_real *running_var;       /* [num_features], unbiased estimates */
    ad_real momentum;           /* running = (1 - momentum) running + momentum batch; 0.1 */
    ad_real eps;                /* added to the variance; 1e-5 */
    int owns_buffers;           /* private: the buffers were allocated by ad_batch_norm_init */
} ad_batch_norm_state;

/* Initialises bn for num_features channels: running_mean 0, running_var 1, momentum 0.1,
   eps 1e-5. running_mean and running_var are the caller's buffers of num_features values (for
   instance inside a parameter store), or both NULL to allocate them with AUTODIFF_MALLOC.
   Either way they are overwritten with 0 and 1, so load saved statistics after this call.
   Returns 0, or -1 (bn cleared) with the reason in err (errlen bytes, always terminated; err
   may be NULL) when num_features < 1, only one buffer is given, or memory runs out. */
AUTODIFF_API int ad_batch_norm_init(ad_batch_norm_state *bn, int num_features, ad_real *running_mean,
                                    ad_real *running_var, char *err, size_t errlen);
/* Frees buffers that ad_batch_norm_init allocated (never the caller's) and clears bn. */
AUTODIFF_API void ad_batch_norm_free(ad_batch_norm_state *bn);
/* Batch normalisation of x [N, C] or [N, C, H, W] per channel C, then times gamma [C] and plus
   beta [C] (either may be NULL). In training mode the statistics are those of the batch (mean
   and biased variance over N, H, W, as PyTorch) and every call updates bn's running mean and
   running (unbiased) variance, whether or not recording is on; the gradient flows through the
   batch statistics. In evaluation mode the running statistics are used as constants and bn is
   not written. Returns NULL when bn is not initialised, x's channels differ from
   bn->num_features, eps is negative or momentum outside [0, 1], gamma or beta is not [C], or,
   in training mode, a channel has a single value (N * H * W = 1). */
AUTODIFF_API ad_tensor *ad_batch_norm(ad_tape *T, ad_tensor *x, ad_batch_norm_state *bn,
                                      ad_tensor *gamma, ad_tensor *beta);
/* Layer normalisation over the last k dimensions of x (mean and biased variance of each group
   of those values, eps added to the variance), then times gamma and plus beta, both shaped as
   the last k dimensions of x (either may be NULL). One fused op: the tape keeps two values per
   group besides the result; a plain backward sweep is one pass over x, a create_graph sweep
   records the derivative with the library's ops (so second derivatives work); results are the
   same bits for any thread count. Returns NULL when k is outside 1..ndim, eps is negative, or
   gamma or beta has the wrong shape. */
AUTODIFF_API ad_tensor *ad_layer_norm(ad_tape *T, ad_tensor *x, int k, ad_tensor *gamma, ad_tensor *beta,
                                      ad_real eps);
/* Rows of weight [V, D] picked by indices[0..n-1]: [n, D]. The indices are copied. When weight
   already has a gradient buffer (a parameter made with ad_tensor_view), ad_backward adds into
   the rows that the indices name and touches no other (repeated indices add up); otherwise the
   gradient is a dense [V, D] tensor, zero in the rows not named. Returns NULL when weight is
   not 2-D, n < 1, indices is NULL or an index is outside 0..V-1. */
AUTODIFF_API ad_tensor *ad_embedding(ad_tape *T, ad_tensor *weight, const int *indices, int n);

/* >>api:rnn: recurrent cells, one time step each, and layers over whole sequences ------------- */
/* One step of an LSTM cell, as torch.nn.LSTMCell: with x [N, I], h and c [N, H],
       gates = x w_ih^T + b_ih + h w_hh^T + b_hh      (w_ih [4H, I], w_hh [4H, H], b_* [4H])
   split along its columns into i, f, g, o (in that order), i, f, o = sigmoid, g = tanh, and
       c' = f * c + i * g,   h' = o * tanh(c').
   Returns h' and stores c' in *c_out (both [N, H], views of one [2, N, H] result, so both live
   until the tape's next reset). Either bias may be NULL. The two products run on the GEMM and
   everything after them in one fused pass; a plain backward sweep runs one fused pass and the
   products' gradients, a create_graph sweep records the derivative with the library's ops (so
   second derivatives work). Unroll a sequence by calling it once per step with the last step's
   h' and c', or run it in one call with ad_lstm (below), which batches the products over the
   steps. Returns NULL (and *c_out NULL) when an input is NULL, or, with the tape's error
   naming ad_lstm_cell and every shape, when c_out is NULL or a shape is not as above. May be
   called from several threads only on different tapes. */
AUTODIFF_API ad_tensor *ad_lstm_cell(ad_tape *T, ad_tensor *x, ad_tensor *h, ad_tensor *c, ad_tensor *w_ih,
                                     ad_tensor *w_hh, ad_tensor *b_ih, ad_tensor *b_hh, ad_tensor **c_out);
/* One step of a GRU cell, as torch.nn.GRUCell: with x [N, I], h [N, H], w_ih [3H, I],
   w_hh [3H, H], b_ih and b_hh [3H] (either may be NULL), the row blocks r, z, n (in that order)
       r = sigmoid(x w_ir^T + b_ir + h w_hr^T + b_hr),   z likewise,
       n = tanh(x w_in^T + b_in + r * (h w_hn^T + b_hn)),   h' = (1 - z) * n + z * h.
   Returns h' [N, H]. Products, fused passes, derivatives and errors as ad_lstm_cell's; ad_gru
   runs a whole sequence in one call. */
AUTODIFF_API ad_tensor *ad_gru_cell(ad_tape *T, ad_tensor *x, ad_tensor *h, ad_tensor *w_ih, ad_tensor *w_hh,
                                    ad_tensor *b_ih, ad_tensor *b_hh);
/* A whole sequence through one LSTM layer, as torch.nn.LSTM with one layer, one direction and
   batch_first false: x [L, N, I] (L time steps of N rows) gives the output [L, N, H], the h of
   every step, each step computed as ad_lstm_cell computes it (the same values up to rounding).
   h0 and c0 [N, H] are the initial state, either NULL for zeros (so a NULL from a failed call
   is taken as zeros too: the tape keeps that call's error); the weights and biases are
   ad_lstm_cell's. *h_n and *c_n, where not NULL, receive the last step's h and c [N, H] (h_n
   is the output's last step). Where unrolled cells do three products of N rows per step with
   each weight, the layer does x w_ih^T and, in the backward sweep, the gradients of x and w_ih
   as one product each over all L N rows, and w_hh's as two (the first step's rows, which read
   h0, and the others'); only h w_hh^T and its input gradient remain products per step, with
   w_hh^T packed for the GEMM once per call rather than at every step (in memory the tape keeps
   for that, as its packing buffers). When the call is recorded, the tape keeps the activated
   gates, tanh(c) and c of every step (6 L N H values); when it is not (no-grad mode, or no
   input that wants a gradient), only the output and one chunk's gates: the input products then
   go 512 rows at a time (at least one step). Stack layers by giving one layer's output to the
   next. Second derivatives work as the cell's. Returns
   NULL (and *h_n, *c_n NULL) when x, w_ih or w_hh is NULL, or, with the tape's error naming
   ad_lstm and every shape, when a shape is not as above. May be called from several threads
   only on different tapes. */
AUTODIFF_API ad_tensor *ad_lstm(ad_tape *T, ad_tensor *x, ad_tensor *h0, ad_tensor *c0, ad_tensor *w_ih,
                                ad_tensor *w_hh, ad_tensor *b_ih, ad_tensor *b_hh, ad_tensor **h_n, ad_tensor **c_n);
/* The same for a GRU layer, as torch.nn.GRU with one layer: x [L, N, I] gives the output
   [L, N, H], each step as ad_gru_cell computes it (up to rounding), from h0 [N, H] (NULL:
   zeros, as ad_lstm's) and ad_gru_cell's weights and biases; *h_n, where not NULL, receives
   the last step's h (a view of the output's last step). x w_ih^T + b_ih and the gradients of
   x and w_ih are one product each over the sequence, w_hh's two, as ad_lstm's. A recorded
   call keeps the activated gates and h w_hh^T + b_hh of every step (6 L N H values), one not
   recorded one chunk's gates, as ad_lstm. Errors and threads as ad_lstm's, naming ad_gru. */
AUTODIFF_API ad_tensor *ad_gru(ad_tape *T, ad_tensor *x, ad_tensor *h0, ad_tensor *w_ih, ad_tensor *w_hh,
                               ad_tensor *b_ih, ad_tensor *b_hh, ad_tensor **h_n);

/* >>api:attention: scaled dot-product attention ------------------------------------------- */
/* softmax(q k^T scale + mask) v per batch and head (PyTorch's scaled_dot_product_attention):
   q [B, H, Tq, D], k [B, H, Tk, D] and v [B, H, Tk, Dv] give [B, H, Tq, Dv]. scale 0 means
   1 / sqrt(D). With causal set, query i sees keys 0..i only (PyTorch's is_causal, the mask
   aligned at the top left when Tq != Tk). One fused op: the forward goes over blocks of query
   rows and of keys with a running maximum and sum (FlashAttention's online softmax), so no
   [Tq, Tk] matrix is kept; besides the result, the tape keeps the log of each query row's
   softmax denominator, B H Tq values. A plain backward sweep recomputes the probabilities block
   by block from q, k and those values and adds dq, dk and dv straight into their buffers; a
   create_graph sweep records the same derivative with matmuls and a softmax, so higher
   derivatives work. The (batch, head) pairs are split over the tape's threads; results are the
   same bits for any thread count. Returns NULL (with the tape's error naming ad_attention and
   the three shapes) when an input is not 4-D, B, H, the key count or D differ where they must
   agree, or scale is not finite. q, k and v may be the same tensor. */
AUTODIFF_API ad_tensor *ad_attention(ad_tape *T, ad_tensor *q, ad_tensor *k, ad_tensor *v, int causal,
                                     ad_real scale);
/* Multi-head self-attention on a fused projection: qkv [B, T, 3 C] holds each position's
   query, key and value side by side, each C = heads x D values of heads in order (x W_qkv with
   W_qkv [E, 3 C] gives them so). Returns [B, T, C], the heads' outputs side by side: the values
   of splitting qkv into q, k and v [B, heads, T, D], ad_attention and merging the heads back,
   bit for bit, without the copies (the op reads and writes the heads where they lie). causal
   and scale as ad_attention's (scale 0: 1 / sqrt(D)). Returns NULL (with the tape's error
   naming ad_self_attention, the shape and heads) when qkv is not 3-D, heads < 1, the last
   dimension is not a multiple of 3 heads, or scale is not finite. */
AUTODIFF_API ad_tensor *ad_self_attention(ad_tape *T, ad_tensor *qkv, int heads, int causal, ad_real scale);

/* >>api:loss: every loss returns a scalar, the mean over the batch ---------------------------- */
/* Cross-entropy of logits [N, C] against labels[N] in 0..C-1 (fused with log-softmax). */
AUTODIFF_API ad_tensor *ad_cross_entropy(ad_tape *T, ad_tensor *logits, const int *labels);
/* mean((pred - target)^2); the shapes must be equal. */
AUTODIFF_API ad_tensor *ad_mse(ad_tape *T, ad_tensor *pred, ad_tensor *target);
/* mean(softplus(x) - x * t), stable for any logits x; targets t in [0, 1], same shape. */
AUTODIFF_API ad_tensor *ad_bce_with_logits(ad_tape *T, ad_tensor *logits, ad_tensor *targets);
/* Negative log-likelihood of log-probabilities logp [N, C] (ad_log_softmax's output) at
   labels[N] in 0..C-1: -mean(logp[i, labels[i]]); labels are copied. ad_nll_loss of
   ad_log_softmax is ad_cross_entropy. PyTorch's class weights, ignore_index and inputs of more
   than two dimensions are not offered. */
AUTODIFF_API ad_tensor *ad_nll_loss(ad_tape *T, ad_tensor *logp, const int *labels);
/* mean(|pred - target|); the shapes must be equal (PyTorch broadcasts them, with a warning).
   The gradient where pred equals target is 0. */
AUTODIFF_API ad_tensor *ad_l1_loss(ad_tape *T, ad_tensor *pred, ad_tensor *target);
/* Huber loss: the mean of d^2 / 2 where |d| < delta and delta (|d| - delta / 2) elsewhere, with
   d = pred - target; delta > 0 and equal shapes, as PyTorch's huber_loss (which broadcasts). */
AUTODIFF_API ad_tensor *ad_huber_loss(ad_tape *T, ad_tensor *pred, ad_tensor *target, ad_real delta);
/* Kullback-Leibler divergence sum(target (log(target) - logp)) / N, N = logp->shape[0] (1 for a
   scalar): PyTorch's kl_div(logp, target, reduction='batchmean') with log-probabilities logp
   and probabilities target, of equal shapes. Where target is 0 the term is 0 and target's
   gradient 0, as in PyTorch; both inputs get gradients. */
AUTODIFF_API ad_tensor *ad_kl_div(ad_tape *T, ad_tensor *logp, ad_tensor *target);

/* >>api:custom: ops of your own, with their own derivative ------------------------------------
   A custom op is a forward on arrays and a backward of one of two kinds, as PyTorch's
   autograd.Function or JAX's custom_vjp:
     backward        records the inputs' gradients with the library's own ops on T (it is called
                     in every sweep; in a create_graph sweep T records, so second and higher
                     derivatives pass through the op);
     backward_array  writes them into arrays: first order only. A create_graph sweep through
                     such an op fails with an error that names it.
   When both are set, backward is used. Inputs that do not require grad get no gradient (their
   needs_grad entry is 0 and the backward may skip them). The op's output requires grad when
   an input does, like any op's. Errors (no forward, a bad output shape, a forward or backward
   that returns non-zero, a missing gradient or one of the wrong shape) are the tape's, and
   name the op as  ad_custom "NAME": ...

       static int lc_fwd(const ad_custom_call *c)             // y = log(cosh(x))
       { for (size_t i = 0; i < c->out->size; i++) c->out->data[i] = logcosh(c->in[0]->data[i]);
         return 0; }
       static int lc_bwd(ad_tape *T, const ad_custom_call *c, ad_tensor *g, ad_tensor **gin)
       { gin[0] = ad_mul(T, g, ad_tanh(T, c->in[0])); return 0; }
       static const ad_custom_op logcosh_op = {.name = "logcosh", .forward = lc_fwd, .backward = lc_bwd};
       ... y = ad_custom(T, &logcosh_op, 1, &x);

   examples/custom_op.c is a complete program with both kinds. */

#define AD_CUSTOM_MAX_INPUTS 16

/* What a custom op's functions receive. */
typedef struct ad_custom_call {
    const char *name;            /* the op's name */
    void *ctx;                   /* the descriptor's ctx */
    void *saved;                 /* saved_bytes bytes on the tape, zeroed before the forward,
                                    which may fill them for the backward; NULL when 0 */
    int nin;                     /* number of inputs */
    ad_tensor *const *in;        /* the inputs (read their data, size and shape) */
    ad_tensor *out;              /* the output, zeroed before the forward; NULL in shape() */
    unsigned char needs_grad[AD_CUSTOM_MAX_INPUTS]; /* in a backward: 1 where input i wants a
                                    gradient (requires grad and leads to what is differentiated) */
} ad_custom_call;

/* Writes the output's values into c->out->data from the inputs. Returns 0, or non-zero to fail
   the op. */
typedef int (*ad_custom_forward_fn)(const ad_custom_call *c);
/* Recorded backward: sets grad_in[i] (all NULL on entry), for each i with c->needs_grad[i], to
   d L / d in[i], a tensor of in[i]'s shape made with ops on T from grad_out (d L / d out, the
   output's shape) and c->in, c->out. Returns 0, or non-zero to fail the sweep. */
typedef int (*ad_custom_backward_fn)(ad_tape *T, const ad_custom_call *c, ad_tensor *grad_out,
                                     ad_tensor **grad_in);
/* Backward on arrays: grad_in[i] (in[i]->size values, zeroed) for each i with c->needs_grad[i],
   NULL for the others. Returns 0, or non-zero to fail the sweep. */
typedef int (*ad_custom_backward_array_fn)(const ad_custom_call *c, const ad_real *grad_out,
                                           ad_real *const *grad_in);
/* The output's shape: sets *ndim (0 .. AD_MAX_DIMS) and shape[0 .. *ndim-1] from the inputs
   (c->out is NULL). Returns 0, or non-zero to fail the op. */
typedef int (*ad_custom_shape_fn)(const ad_custom_call *c, int *ndim, int *shape);

/* A custom op. Zero-initialised fields take their defaults. The descriptor is copied when the
   op is applied, so it may be a local variable; ctx must outlive the tape's use of the output. */
typedef struct ad_custom_op {
    const char *name;            /* for messages, copied (NULL: "custom") */
    ad_custom_forward_fn forward;                 /* required */
    ad_custom_backward_fn backward;               /* recorded backward (create_graph works) */
    ad_custom_backward_array_fn backward_array;   /* or: on arrays, first order only */
    ad_custom_shape_fn shape;    /* NULL: the output has the shape of in[0] */
    void *ctx;                   /* passed on as c->ctx */
    size_t saved_bytes;          /* bytes kept on the tape from forward to backward (c->saved) */
} ad_custom_op;

/* Applies op to in[0 .. nin-1] (1 <= nin <= AD_CUSTOM_MAX_INPUTS): the output, made on T by
   op->forward, recorded with op's backward when an input requires grad. An op without a
   backward may only be applied to inputs that need no gradient (or in no-grad mode). Returns
   NULL on error, and for a NULL input. */
AUTODIFF_API ad_tensor *ad_custom(ad_tape *T, const ad_custom_op *op, int nin, ad_tensor *const *in);

/* >>api:gradcheck: derivatives against finite differences ------------------------------------
   ad_gradcheck evaluates f on tapes of its own and compares, for every element of every input
   that requires grad, the gradient from ad_backward of L = sum(w * f(x)) (w fixed weights
   uniform in [0.5, 1.5], so that every element of the output counts) with the central
   difference (L(x + h) - L(x - h)) / 2h, h = eps * max(1, |x|). With orders & 2 it checks the
   second derivatives too: the gradient of s = sum_i sum(v_i * dL/dx_i) (v_i fixed, uniform in
   [-1, 1]) recorded through ad_grad(..., create_graph=1), against central differences of s
   computed by plain sweeps: a Hessian-vector product per input, the way PyTorch's
   gradgradcheck works. An element passes when |analytic - numeric| <= atol + rtol * |numeric|.
   Precision: built with AUTODIFF_DOUBLE the check is tight (defaults below, those of the
   library's own tests). In a float build f itself runs in float, so differences of its values
   lose about half the digits: the defaults become eps 1e-3 (second order 1e-2) and atol =
   rtol = 1e-2, enough to catch a wrong derivative but not a subtly inexact one; use
   AUTODIFF_DOUBLE for tight checks. */

/* The function under check: builds its result from the inputs on T (any shape). */
typedef ad_tensor *(*ad_fn)(ad_tape *T, ad_tensor *const *in, void *ctx);

typedef struct ad_gradcheck_options {
    int orders;                  /* 1 (and 0): first derivatives; 2: second only; 3: both */
    double eps, atol, rtol;      /* first order; 0: 1e-6, 1e-6, 1e-5 (float build: 1e-3, 1e-2, 1e-2) */
    double eps2, atol2, rtol2;   /* second order; 0: 1e-5, 1e-5, 1e-4 (float: 1e-2, 1e-2, 1e-2) */
    uint64_t seed;               /* of the weights w (0: 1234); the v use seed 99 */
} ad_gradcheck_options;

typedef struct ad_gradcheck_result {
    int passed;                  /* 1 when every element checked passed */
    size_t checked;              /* elements compared (of both orders) */
    double max_error;            /* the largest |analytic - numeric| */
    double max_ratio;            /* the largest |analytic - numeric| / (atol + rtol |numeric|):
                                    above 1 fails; infinite for a NaN */
    int order;                   /* the worst element (the largest ratio): its order (1, 2), */
    int input;                   /*   which input, */
    size_t index;                /*   its flat index in that input, */
    double analytic, numeric;    /*   and its two values */
    size_t mismatches;           /* elements that failed */
    char message[320];           /* one line naming the worst element, for a report */
} ad_gradcheck_result;

/* Checks f's derivatives at the values of in[0 .. n-1] (tensors of T; those that do not require
   grad are held constant and not checked; 1 <= n <= AD_CUSTOM_MAX_INPUTS). T is used for its
   error and its thread count only; nothing is recorded on it. opt may be NULL (defaults); res
   may be NULL. Returns 0 when every element passes, 1 when one does not (res says which), -1
   when f fails or an argument is wrong (with T's error set, naming f's own error). Runs f
   about 2 * (elements) + 1 times per order; use small inputs. */
AUTODIFF_API int ad_gradcheck(ad_tape *T, ad_fn f, void *ctx, int n, ad_tensor *const *in,
                              const ad_gradcheck_options *opt, ad_gradcheck_result *res);

/* >>api:params --------------------------------------------------------------------------------
   A parameter store holds named parameters that outlive every tape. All values sit in one
   contiguous buffer and all gradients in a second one, parameter after parameter in the order
   they were added, so an optimizer step, a checkpoint or an MPI_Allreduce of the gradients is one
   pass over one array (ad_params_values, ad_params_grads, ad_params_scalars).

   A parameter is known by its index, the handle ad_params_add returns (0, 1, 2, ... in the order
   of adding). Adding a parameter may move the buffers, so keep handles, not pointers: pointers
   from ad_params_info, ad_params_values and ad_params_grads, and tensors made by ad_param, stay
   valid until the next ad_params_add. Add every parameter before training starts.

   Errors (duplicate names, bad shapes, out of memory, refused checkpoints, bad optimizer
   settings) leave a message on the store, read with ad_params_error; the first one sticks until
   ad_params_clear_error. Nothing aborts.

   Threads: a store and its optimizer must not be used by two threads at once. Tapes on several
   threads may read one store through ad_param, but their ad_backward calls all add into its one
   gradient buffer: run those one at a time, or give each thread its own store and sum the
   gradient buffers. */
typedef struct ad_params ad_params;

/* Longest parameter name, in bytes. */
#define AD_PARAM_NAME_MAX 1024

/* How ad_params_add fills a new parameter. A zero ad_init (or NULL) means zeros. The fields
   follow torch.nn.init's names:
       kind                     a                        b                gain
       AD_INIT_ZEROS            -                        -                -
       AD_INIT_CONSTANT         the value                -                -
       AD_INIT_UNIFORM          low bound                high bound       -    (a = b = 0: [0, 1))
       AD_INIT_NORMAL           mean                     std (0: 1)       -
       AD_INIT_XAVIER_UNIFORM   -                        -                0: 1
       AD_INIT_XAVIER_NORMAL    -                        -                0: 1
       AD_INIT_KAIMING_UNIFORM  negative slope of the    -                0: sqrt(2 / (1 + a^2))
       AD_INIT_KAIMING_NORMAL   leaky relu that follows (0 for relu)      (sqrt(2) for relu)
   Uniform draws lie in [low, high). Xavier (Glorot): uniform in +-gain * sqrt(6 / (fan_in +
   fan_out)), or normal with std gain * sqrt(2 / (fan_in + fan_out)). Kaiming (He, fan_in mode):
   std = gain / sqrt(fan_in); the uniform form draws in +-sqrt(3) * std.
   Fans (ad_init_fans): a 2-D weight is [in, out] as ad_linear's W (y = x W), so fan_in =
   shape[0] and fan_out = shape[1]; a weight with 3 or more dimensions is a convolution's
   [out, in/groups, k1, k2, ...], so fan_in = shape[1] * k1 * k2 * ... and fan_out = shape[0] *
   k1 * k2 * ...; 1-D [n]: both n; 0-D: both 1.
   Values come from the store's ad_rng (seeded by ad_params_new): one ad_rng_uniform or
   ad_rng_normal per element, in order, computed in double and rounded to ad_real. The same seed
   and the same sequence of calls give the same numbers on every platform (normals go through
   the C library's log and cos). */
typedef enum ad_init_kind {
    AD_INIT_ZEROS = 0,
    AD_INIT_CONSTANT,
    AD_INIT_UNIFORM,
    AD_INIT_NORMAL,
    AD_INIT_XAVIER_UNIFORM,
    AD_INIT_XAVIER_NORMAL,
    AD_INIT_KAIMING_UNIFORM,
    AD_INIT_KAIMING_NORMAL
} ad_init_kind;

typedef struct ad_init {
    ad_init_kind kind;
    double a, b;   /* see the table above */
    double gain;   /* 0: the default of the kind */
} ad_init;

/* One parameter, as ad_params_info describes it. Pointers are valid until the next add. */
typedef struct ad_param_info {
    const char *name;
    int ndim;
    const int *shape;
    size_t size;     /* number of scalars */
    size_t offset;   /* index of its first scalar in the flat buffers */
    ad_real *value;  /* ad_params_values(P) + offset */
    ad_real *grad;   /* ad_params_grads(P) + offset */
} ad_param_info;

/* A new, empty store whose initialisers draw from an ad_rng seeded with seed. Returns NULL only
   when memory runs out. */
AUTODIFF_API ad_params *ad_params_new(uint64_t seed);
/* Frees the store and everything in it. NULL is allowed. Free its optimizers first or after;
   an optimizer must not be used once its store is freed. */
AUTODIFF_API void ad_params_free(ad_params *P);
/* The first error recorded on the store, or NULL while there is none. */
AUTODIFF_API const char *ad_params_error(const ad_params *P);
AUTODIFF_API void ad_params_clear_error(ad_params *P);
/* Adds a parameter named name (unique, 1..AD_PARAM_NAME_MAX bytes) with ndim dimensions (0..
   AD_MAX_DIMS) of the given positive sizes, filled by init (NULL: zeros); its gradient starts at
   zero. Returns its handle (index), or -1 with the store's error set. */
AUTODIFF_API int ad_params_add(ad_params *P, const char *name, int ndim, const int *shape,
                               const ad_init *init);
/* Refills parameter id by init (NULL: zeros) with the next numbers of the store's rng.
   Returns 0, or -1 with the store's error set. */
AUTODIFF_API int ad_params_init(ad_params *P, int id, const ad_init *init);
/* The fans of a weight of this shape, by the convention described at ad_init. */
AUTODIFF_API void ad_init_fans(int ndim, const int *shape, double *fan_in, double *fan_out);
/* The handle of the parameter named name, or -1 when there is none. */
AUTODIFF_API int ad_params_find(const ad_params *P, const char *name);
/* Number of parameters, and of scalars in all of them (the length of the flat buffers). */
AUTODIFF_API int ad_params_count(const ad_params *P);
AUTODIFF_API size_t ad_params_scalars(const ad_params *P);
/* Describes parameter id; all fields are zero (name NULL) when there is no such parameter. */
AUTODIFF_API ad_param_info ad_params_info(ad_params *P, int id);
/* The flat value and gradient buffers (ad_params_scalars long), or NULL when empty. Each starts
   on a 64-byte boundary; adding a parameter may move them. */
AUTODIFF_API ad_real *ad_params_values(ad_params *P);
AUTODIFF_API ad_real *ad_params_grads(ad_params *P);
/* Sets every gradient in the store to zero. */
AUTODIFF_API void ad_params_zero_grad(ad_params *P);
/* The same, split over the threads of tape T (see >>threads) when the store is large; T NULL
   means the calling thread alone. T is only borrowed for the call. */
AUTODIFF_API void ad_params_zero_grad_on(ad_params *P, ad_tape *T);
/* Marks parameter id as trained (1, the default) or frozen (0): optimizers leave frozen values
   alone; checkpoints keep them. Frozen entries suit state that is not learned by gradient,
   such as batch norm's running statistics. Returns 0, or -1 with the store's error set. */
AUTODIFF_API int ad_params_set_trainable(ad_params *P, int id, int trainable);
/* Puts parameter id in a parameter group, as PyTorch's param groups are used: its learning rate
   is the optimizer's lr times lr_scale (default 1; finite and >= 0), and weight_decay 0 exempts
   it from the optimizer's weight decay (default 1: decayed), so that AdamW, or any optimizer
   with weight_decay, leaves biases, norms and embeddings undecayed. Every optimizer kind
   honours both, on threads too (ad_optim_step_on), including a schedule's lr set with
   ad_optim_set_lr, which each step scales anew. Checkpoints keep both, and loading one restores
   them (see >>api:checkpoint). ad_lbfgs ignores them (PyTorch's LBFGS allows one group).
   Returns 0, or -1 with the store's error set (no such parameter, or lr_scale negative or not
   finite; the setting stays as it was). */
AUTODIFF_API int ad_params_set_group(ad_params *P, int id, double lr_scale, int weight_decay);
/* Parameter id's group settings into *lr_scale and *weight_decay (1: decayed, 0: exempt);
   either pointer may be NULL. Returns 0, or -1 with the store's error set when there is no
   such parameter (the outputs are then left alone). */
AUTODIFF_API int ad_params_group(ad_params *P, int id, double *lr_scale, int *weight_decay);
/* Bytes of the program's own that travel with the store's checkpoints: what a training run
   needs to continue where it stopped beyond the parameters and the optimizer (the epoch, a
   batcher's position from ad_batcher_get_state, the random state of dropout masks). The len
   bytes at data are copied (len 0 removes them); at most AD_PARAMS_EXTRA_MAX. Loading a
   checkpoint replaces them with the file's (none when it has none). Returns 0, or -1 with the
   store's error set. */
#define AD_PARAMS_EXTRA_MAX (1 << 24)
AUTODIFF_API int ad_params_set_extra(ad_params *P, const void *data, size_t len);
/* The store's extra bytes, their number in *len (len may be NULL); NULL when there are none.
   Valid until the next ad_params_set_extra or checkpoint load. */
AUTODIFF_API const void *ad_params_extra(const ad_params *P, size_t *len);
/* Parameter id as a leaf on T that requires grad: its values are the store's (not copied) and
   ad_backward adds its gradient into the store's gradient buffer. Returns NULL with T's error
   set when P is NULL or id is not a parameter. */
AUTODIFF_API ad_tensor *ad_param(ad_tape *T, ad_params *P, int id);

/* >>api:hooks: gradient hooks, anomaly mode, names and pictures of the tape -----------------
   Hooks see gradients as the backward sweep makes them. A tensor's hook is called once per
   sweep (ad_backward, ad_grad) with the tensor's whole gradient from that sweep, before the
   gradient goes on to the entries that made the tensor, or, for a leaf, before it is added into
   leaf->grad; it may return another gradient to use instead (PyTorch's register_hook). A store's
   hook is told when a parameter's gradient is final during ad_backward, so that a data-parallel
   program can start reducing it while the sweep goes on. Hooks, retained gradients and names
   belong to the tape's current recording: ad_tape_reset forgets them, with the tensors. Without
   any hook, retained gradient or anomaly mode the sweep is the plain one: they cost nothing
   when they are not used. Hooks run on the thread that called ad_backward or ad_grad. */

/* A tensor's gradient hook: x the tensor, grad d y / d x from this sweep (x's shape; read it,
   never write into it: it may be shared). Return NULL to keep grad, or the gradient to use
   instead: a tensor of x's shape on T (made with the library's ops, or ad_tensor_new). With
   create_graph (ad_grad) the ops a hook runs are recorded, so its replacement is
   differentiated again. A hook whose ops fail (the tape's error is set when it returns) stops
   the sweep: ad_backward returns -1, ad_grad NULL. */
typedef ad_tensor *(*ad_grad_hook)(ad_tape *T, ad_tensor *x, ad_tensor *grad, void *ctx);
/* Adds hook (called with ctx) to x, which must require grad. Several hooks on one tensor run
   in the order they were added, each given the gradient the one before returned. Returns 0,
   or -1 with the tape's error set. */
AUTODIFF_API int ad_register_hook(ad_tensor *x, ad_grad_hook hook, void *ctx);
/* Makes ad_backward fill x->grad for x, a tensor made by an op (PyTorch's retain_grad): the
   gradient after x's hooks, added into x->grad as for a leaf (x->grad allocated on the tape and
   zeroed first). Nothing to do for a leaf, which always gets its gradient. ad_grad leaves
   x->grad alone. Returns 0, or -1 with the tape's error set (x does not require grad). */
AUTODIFF_API int ad_retain_grad(ad_tensor *x);

/* A store's hook: the gradient of parameter id (ad_params_info(P, id).grad) is complete. */
typedef void (*ad_params_grad_hook)(ad_params *P, int id, void *ctx);
/* Sets P's hook (NULL: none). During each ad_backward on a tape where some parameter of P was
   put with ad_param after the hook was set, hook is called exactly once for every parameter of
   P, in the order the sweep completes them: right after the last tape entry that adds to the
   parameter's gradient has run (the earliest entry that uses it; the sweep goes on after the
   hook returns); at the end, for the parameters the tape does not use, and for those with a
   tensor hook (ad_register_hook), whose gradient reaches the store only then. The hook may
   read the gradient and start sending it (an MPI_Iallreduce in place): the sweep never touches
   that gradient again. It must not use the tape or the store's other functions. Not called by
   ad_grad, nor after a sweep that failed. */
AUTODIFF_API void ad_params_set_grad_hook(ad_params *P, ad_params_grad_hook hook, void *ctx);

/* Anomaly mode on (1) or off (0, the default); returns the previous setting, and -1 for a NULL
   tape. It lasts across ad_tape_reset. When on, each op checks its result, and each entry of a
   backward sweep the gradients it made, for NaN and Inf, and the first op to make one from
   finite values records an error that names the op, forward or backward, and its inputs'
   shapes and names (ad_set_name), for example
       ad_log forward: NaN in the result ([3]) from input 0 ([3], "x")
       ad_sqrt backward: Inf in the gradient of input 0 ([3], "x")
   the op returns NULL, ad_backward -1. Checked exactly: in the forward, the result of every op
   that goes through the tape (recorded or not; not ad_param, leaves and constants), when
   every input's values are finite; in a sweep, after each entry that runs, each input's
   gradient, when the entry's incoming gradient, its result's values and its inputs' values are
   finite and that input's gradient was finite (or empty) before the entry. So a NaN that comes
   from a NaN already there is never blamed on the op that passed it on. The ops that a sweep
   itself runs (create_graph, or in a hook) are covered by the entry's check, not their own.
   A gradient hook's replacement is not checked. Costs a pass over each op's inputs and result
   (and each entry's gradients) while on; nothing while off. */
AUTODIFF_API int ad_set_detect_anomaly(ad_tape *T, int on);
/* Names a tensor for anomaly messages and pictures (ad_tape_write_dot); the text is copied
   into the tape's arena (at most 255 bytes kept). A later name replaces an earlier one. Returns
   x, or NULL with the tape's error set (name NULL, x made before the tape's last reset, out of
   memory); NULL for a NULL x. */
AUTODIFF_API ad_tensor *ad_set_name(ad_tensor *x, const char *name);
/* Writes the graph that y depends on as Graphviz DOT into the file at path (replaced): each op
   a box with its name (ad_mul, ad_linear, ...), its result's shape and the name given with
   ad_set_name, each leaf an ellipse with its name (ad_set_name, else a parameter's store name,
   else "leaf" or "constant") and shape, parameters and leaves that require grad shaded, and an
   edge from each input to the op that used it. Only what y depends on is drawn; an op on
   inputs that did not require grad (or run with recording off) has no entry and is drawn as a
   constant. Render with `dot -Tsvg graph.dot -o graph.svg`. Writes nothing anywhere else.
   Returns 0, or -1 with the tape's error set (y NULL or not of this tape, path NULL, the file
   cannot be written: the message names the path). */
AUTODIFF_API int ad_tape_write_dot(ad_tape *T, const ad_tensor *y, const char *path);

/* >>api:optim ---------------------------------------------------------------------------------
   Optimizers update a whole store from its gradients with PyTorch's semantics (torch.optim.SGD,
   Adam, AdamW, RMSprop, Adagrad, without amsgrad / maximize / sparse gradients). Their state
   (momentum, m, v, running means, sums of squares) lives in flat buffers parallel to the
   store's. Each parameter's learning rate is lr times its group's lr scale, and its weight
   decay is the optimizer's or none (ad_params_set_group). Make the optimizer after adding every
   parameter. Errors go to the store's message.
   ad_lbfgs, at the end of this section, is L-BFGS for full-batch fitting: it evaluates the loss
   itself, through a closure, as torch.optim.LBFGS does. */
typedef enum ad_optim_kind {
    AD_OPTIM_SGD = 0,
    AD_OPTIM_ADAM,
    AD_OPTIM_ADAMW,
    AD_OPTIM_RMSPROP,
    AD_OPTIM_ADAGRAD
} ad_optim_kind;

/* Optimizer settings; a zero field takes the default shown.
       field         default                  used by
       kind          AD_OPTIM_SGD
       lr            1e-3; RMSprop and        all (times each parameter's lr scale)
                     Adagrad: 1e-2
       momentum      0 (none)                 SGD, RMSprop (its buffer adds g / avg)
       dampening     0                        SGD
       nesterov      0 (off)                  SGD; needs momentum > 0 and dampening 0
       weight_decay  0; AdamW: 1e-2           SGD, Adam, RMSprop and Adagrad add weight_decay * p
                                              to the gradient; AdamW multiplies p by
                                              1 - lr * weight_decay; parameters put in a group
                                              without weight decay get none
       beta1, beta2  0.9, 0.999               Adam, AdamW
       eps           1e-8; Adagrad: 1e-10     Adam, AdamW, RMSprop, Adagrad: added to the root
                                              of the mean (Adagrad: the sum) of squares
       zero_grad     0 (off)                  all: when set, each step also sets every gradient
                                              of the store to zero, each piece right after its
                                              update while it is still in cache, so that the
                                              training loop needs no ad_params_zero_grad pass
       alpha         0.99                     RMSprop: the running mean of squares is
                                              v = alpha v + (1 - alpha) g^2
       centered      0 (off)                  RMSprop: when set, divides by the root of v minus
                                              the squared running mean of g (same alpha)
       lr_decay      0                        Adagrad: step t uses lr / (1 + (t - 1) lr_decay)
       initial_accumulator_value  0           Adagrad: where each sum of squares starts
   Because zero means "default", lr, beta1, beta2, eps, alpha and AdamW's weight_decay cannot be
   set to exactly 0 here (AdamW without decay is Adam; ad_optim_set_lr accepts 0). Fields a kind
   does not use are ignored, but must be finite (a checkpoint stores them all). */
typedef struct ad_optim_desc {
    ad_optim_kind kind;
    double lr;
    double momentum, dampening;
    int nesterov;
    double weight_decay;
    double beta1, beta2, eps;
    int zero_grad;
    double alpha;
    int centered;
    double lr_decay, initial_accumulator_value;
} ad_optim_desc;

typedef struct ad_optim ad_optim;

/* An optimizer for every parameter of P (desc NULL: all defaults). Returns NULL when the
   settings are invalid or memory runs out, with P's error set. */
AUTODIFF_API ad_optim *ad_optim_new(ad_params *P, const ad_optim_desc *desc);
AUTODIFF_API void ad_optim_free(ad_optim *O);
/* Updates every parameter from the store's gradients, which it leaves as they are, or sets to
   zero when the optimizer was made with zero_grad. Returns 0, or -1 with the store's error set
   (parameters were added after the optimizer was made). */
AUTODIFF_API int ad_optim_step(ad_optim *O);
/* The same step, split over the threads of tape T (see >>threads) when the store is large; T
   NULL means the calling thread alone. T is only borrowed for the call. Every scalar goes
   through the same operations whatever the split, so the result is identical for any thread
   count. In a training loop, pass the tape the step was recorded on: its workers are still
   spinning from the backward sweep and take their share at once. */
AUTODIFF_API int ad_optim_step_on(ad_optim *O, ad_tape *T);
/* The learning rate used by the next step; set it before each step to follow a schedule.
   A negative or non-finite lr is refused with the store's error set. */
AUTODIFF_API void ad_optim_set_lr(ad_optim *O, double lr);
AUTODIFF_API double ad_optim_lr(const ad_optim *O);
/* Steps taken so far (restored by ad_checkpoint_load). */
AUTODIFF_API uint64_t ad_optim_steps(const ad_optim *O);
/* The settings in use, with the defaults filled in (all zero for NULL). */
AUTODIFF_API ad_optim_desc ad_optim_settings(const ad_optim *O);

/* Scales every gradient of P by max_norm / (norm + 1e-6) when that is below 1, as PyTorch's
   clip_grad_norm_, where norm is the L2 norm of all gradients together, computed in double
   (the squares summed in chunks whose length depends on the store's size alone).
   Returns that norm from before clipping; a non-finite norm is returned and nothing is scaled.
   Returns -1 with the store's error set when max_norm is negative or NaN. */
AUTODIFF_API double ad_clip_grad_norm(ad_params *P, double max_norm);
/* The same, split over the threads of tape T (see >>threads) when the store is large; T NULL
   means the calling thread alone. T is only borrowed for the call. The norm is summed in chunks
   fixed by the store's size, so norm and gradients are identical for any thread count. */
AUTODIFF_API double ad_clip_grad_norm_on(ad_params *P, double max_norm, ad_tape *T);

/* Learning-rate schedules: pure functions of the step, to pass to ad_optim_set_lr.
   Step decay: lr0 * gamma^floor(epoch / step_size) (lr0 when step_size <= 0 or epoch <= 0). */
AUTODIFF_API double ad_lr_step_decay(double lr0, int64_t step_size, double gamma, int64_t epoch);
/* Linear warmup, then cosine decay: lr0 * (step + 1) / warmup_steps for step < warmup_steps
   (reaching lr0 at the last warmup step), then min_lr + (lr0 - min_lr) * (1 + cos(pi * t)) / 2
   with t = (step - warmup_steps) / (total_steps - warmup_steps), and min_lr from total_steps on.
   A negative step counts as 0. */
AUTODIFF_API double ad_lr_cosine(double lr0, double min_lr, int64_t warmup_steps, int64_t total_steps,
                                 int64_t step);

/* L-BFGS, as torch.optim.LBFGS: each ad_lbfgs_step runs up to max_iter iterations of limited-
   memory BFGS (the two-loop recursion over the last history_size pairs of steps and gradient
   changes), each with a fixed step lr (the first of all: lr * min(1, 1 / sum |g|)) or a line
   search that meets the strong Wolfe conditions (c1 1e-4, c2 0.9, at most 25 evaluations, by
   cubic interpolation, as PyTorch's _strong_wolfe). It suits full-batch fitting of small and
   middle-sized problems, and needs the loss as a function it can evaluate again: a closure.

   The closure records the loss on tape T from the store's parameters (ad_param), runs
   ad_backward on it and returns its value (ad_item), or NaN when something failed. Before each
   call ad_lbfgs_step resets T and sets the store's gradients to zero, so the closure needs
   neither; keep nothing on T across a step. Trained parameters move; frozen ones
   (ad_params_set_trainable) stay, and lr scales and weight-decay groups are ignored, as
   PyTorch's LBFGS takes one group. The state (history, last direction and step) is kept
   between steps, not in checkpoints. */
typedef double (*ad_closure)(ad_tape *T, void *ctx);

typedef enum ad_line_search {
    AD_LINE_SEARCH_NONE = 0,     /* a fixed step of lr along the direction */
    AD_LINE_SEARCH_STRONG_WOLFE  /* PyTorch's line_search_fn="strong_wolfe" */
} ad_line_search;

/* L-BFGS settings; a zero field takes PyTorch's default shown.
       field             default             meaning
       lr                1                   step length (the line search's first trial)
       max_iter          20                  iterations per ad_lbfgs_step
       max_eval          max_iter * 5 / 4    closure calls per step (checked after each iteration)
       tolerance_grad    1e-7                stop when max |g| is at most this
       tolerance_change  1e-9                stop when the loss or every component of the step
                                             changes by less (directional derivative: above -it)
       history_size      100                 pairs of steps and gradient changes kept
       line_search       AD_LINE_SEARCH_NONE
   Negative numbers are refused; tolerances of exactly 0 cannot be set (zero means default), but
   a tiny one such as 1e-300 stops no sooner. */
typedef struct ad_lbfgs_desc {
    double lr;
    int max_iter, max_eval;
    double tolerance_grad, tolerance_change;
    int history_size;
    ad_line_search line_search;
} ad_lbfgs_desc;

typedef struct ad_lbfgs ad_lbfgs;

/* L-BFGS over the trained parameters of P (desc NULL: all defaults). Make it after adding every
   parameter. Returns NULL when the settings are invalid or memory runs out, with P's error set.
   Its memory: about 8 copies of the store's values, and 2 more for each history pair, made as
   the history grows. */
AUTODIFF_API ad_lbfgs *ad_lbfgs_new(ad_params *P, const ad_lbfgs_desc *desc);
AUTODIFF_API void ad_lbfgs_free(ad_lbfgs *L);
/* One optimization step (up to max_iter iterations) with closure(T, ctx) evaluating the loss.
   Returns the loss at the parameters as they were when it was called, as PyTorch's step does.
   On failure (the closure returned NaN, a gradient had a NaN or an infinity, T or closure NULL,
   parameters added after ad_lbfgs_new, out of memory) returns NaN with P's error set, which
   quotes T's error when the closure left one; the parameters are then those of the last
   completed iteration, and a later step goes on from there. A loss of +Inf at a trial point is
   no failure: the line search backs off from it. Threads: the closure's ops
   and the zeroing of gradients run on T's threads; L-BFGS's own arithmetic (dot products in
   double, in one fixed order) on the calling thread, so results do not depend on the count. */
AUTODIFF_API double ad_lbfgs_step(ad_lbfgs *L, ad_tape *T, ad_closure closure, void *ctx);
/* The settings in use, defaults filled in (all zero for NULL). */
AUTODIFF_API ad_lbfgs_desc ad_lbfgs_settings(const ad_lbfgs *L);
/* Iterations and closure calls of all steps so far (PyTorch's state n_iter and func_evals). */
AUTODIFF_API int64_t ad_lbfgs_iterations(const ad_lbfgs *L);
AUTODIFF_API int64_t ad_lbfgs_evaluations(const ad_lbfgs *L);

/* >>api:checkpoint ----------------------------------------------------------------------------
   A checkpoint holds every parameter's name, shape, frozen flag, group (lr scale and whether
   weight decay applies: ad_params_set_group) and values, optionally an optimizer's kind,
   settings, step count and state, and the store's extra bytes (the program's own state:
   ad_params_set_extra), in the little-endian format described at >>impl:checkpoint. Loading
   validates the whole file against the store (and optimizer) before it changes anything: a
   truncated, corrupt, foreign or mismatched file is refused with the reason in the store's
   error, and the parameters and optimizer stay bit for bit as they were.
   Loading restores the values, the parameters' groups and the extra bytes, and with an
   optimizer its step count, state and settings: the file's settings win over the optimizer's,
   every field of ad_optim_desc (lr and zero_grad included), and the file's groups over the
   store's, as settings of the training; a file of an older version leaves what it does not
   hold as it was (version 1 has no zero_grad, versions 1 and 2 no groups and none of the
   RMSprop and Adagrad settings). The optimizer's kind must be the file's, and so must the
   number of its state buffers (SGD's momentum, RMSprop's momentum and centered). Gradients are
   not touched, nor which parameters are frozen (the store's own setting, part of its model).
   A file written with an optimizer may be loaded without one. Together these let training
   continue exactly where a run stopped: the same steps give the same parameters, bit for bit,
   as if it had never stopped.
   Every function returns 0 on success and -1 (store's error set) on failure. */

/* Bytes of a checkpoint of P with optimizer O (may be NULL), or 0 when P is NULL or the size
   does not fit in a size_t. */
AUTODIFF_API size_t ad_checkpoint_size(const ad_params *P, const ad_optim *O);
/* Writes the checkpoint into buf, which must hold ad_checkpoint_size(P, O) bytes. */
AUTODIFF_API int ad_checkpoint_save_memory(void *buf, size_t cap, ad_params *P, const ad_optim *O);
/* Loads a checkpoint from len bytes at data into P and, when not NULL, O. */
AUTODIFF_API int ad_checkpoint_load_memory(const void *data, size_t len, ad_params *P, ad_optim *O);
#ifndef AUTODIFF_NO_STDIO
/* Saves atomically: writes path.tmp-<16 random hex digits> and renames it over path, so path
   holds either the old or the new checkpoint, never a part of one (not flushed to the disk
   itself: no fsync; on Windows the old file is removed just before the rename). A save killed
   midway leaves its temporary file; the next save of the same path removes such files first
   (where <dirent.h> is available), and a save of the same path running at that moment in
   another process then fails, leaving path whole: save each path from one process at a time. */
AUTODIFF_API int ad_checkpoint_save(const char *path, ad_params *P, const ad_optim *O);
/* Reads the whole file (at most the size of the largest checkpoint this store can accept) and
   loads it as ad_checkpoint_load_memory does. */
AUTODIFF_API int ad_checkpoint_load(const char *path, ad_params *P, ad_optim *O);
/* A new store holding the parameters of a checkpoint file (names, shapes, frozen flags, groups,
   values and extra bytes; optimizer state is skipped), for programs that only run a trained model or
   that read the extra bytes before building their model. The file's table is checked against
   its length before the store grows. Returns NULL on failure with the reason in err (errlen
   bytes, always terminated; may be NULL). */
AUTODIFF_API ad_params *ad_params_load(const char *path, char *err, size_t errlen);
#endif

/* >>api:data ----------------------------------------------------------------------------------
   Training data: IDX files (MNIST, Fashion-MNIST; raw or gzipped), images through stb_image,
   image folders with one subfolder per class, and shuffled mini-batches.

   stb_image: .gz files and images are decoded with stb_image.h. Include <stb/stb_image.h> BEFORE
   autodiff.h (and define STB_IMAGE_IMPLEMENTATION in one file of the program); without it those
   paths fail with a message saying so, and raw IDX files still load.

   Errors: every function that can fail returns 0 on success, or -1 with a reason written into
   err (errlen bytes, always terminated; err may be NULL) that begins with the function's name.
   File contents are untrusted: sizes are checked against explicit limits and the real length
   of the data before anything of that size is allocated; nothing aborts, and a failed call
   leaves its output struct zeroed with nothing allocated.
   Limits: no file, decompressed stream or image's values (as ad_real) may exceed
   AUTODIFF_DATA_MAX_BYTES bytes (default 1 GiB; define it in the implementation file to change
   it). An image's size is read from its header (stbi_info) before it is decoded.
   stb_image: Debian 12's stb_image 2.27 has faults that a file can reach. Images are checked
   before stb_image sees them, and refused with the reason: JPEG Huffman tables of more than
   256 codes (written past its arrays), PNG chunks longer than the file (allocated as stated),
   PGM/PPM files with 16-bit samples (read wrongly), malformed headers or missing pixels
   (returned uninitialised), and PSD, HDR and PIC files (out-of-range casts, an endless loop on
   a cut-short HDR). A PNG's empty IDAT chunks, which the standard allows and stb_image
   mishandles, are dropped from a copy. The formats read are PNG, JPEG, BMP, GIF, TGA, PGM and
   PPM. Decoders read untrusted bytes: keep stb_image up to date.
   Memory: results are allocated with AUTODIFF_MALLOC; release them with the matching _free.
   Threads: calls on different objects may run concurrently. */

/* A raw IDX file of unsigned bytes: images (magic 0x00000803: count, rows, cols) or labels
   (magic 0x00000801: count). */
typedef struct ad_idx {
    int ndim;                   /* 3 for images, 1 for labels */
    int dims[3];                /* dims[0] is the count; images: dims[1] rows, dims[2] cols */
    size_t size;                /* bytes in data: the product of dims */
    unsigned char *data;
} ad_idx;

/* A labelled dataset held in memory. Sample i is x + i * sample_size, with shape[] (images are
   [C, H, W]; MNIST is [1, 28, 28]); values are in [0, 1]. */
typedef struct ad_dataset {
    int count;                  /* number of samples */
    int ndim;                   /* dimensions of one sample */
    int shape[AD_MAX_DIMS];     /* shape of one sample */
    size_t sample_size;         /* values per sample: the product of shape */
    ad_real *x;                 /* count * sample_size values */
    int *labels;                /* count class indices in 0 .. classes-1, or NULL */
    int classes;                /* number of classes */
    char **class_names;         /* folder datasets: the class folders' names; otherwise NULL */
} ad_dataset;

/* An image as a [channels, height, width] array of values in [0, 1]. */
typedef struct ad_image {
    int channels, height, width;
    ad_real *data;
} ad_image;

/* Flags of ad_batcher_init. */
enum {
    AD_BATCH_SHUFFLE = 1,       /* a new random order every epoch */
    AD_BATCH_DROP_LAST = 2      /* skip the last batch of an epoch when it is smaller */
};

/* Walks a dataset in mini-batches. Fields are private. */
typedef struct ad_batcher {
    const ad_dataset *ds;
    int count;                  /* ds->count when the batcher was made */
    int batch_size, flags;
    int *order;                 /* this epoch's permutation of the sample indices */
    int pos;                    /* next position in order */
    ad_rng rng;
    ad_rng epoch_rng;           /* rng as it was before this epoch's order was drawn */
} ad_batcher;

/* Parses an IDX file held in memory: raw, or gzip (recognised by its magic bytes 1f 8b, needs
   stb_image). The bytes are not kept; idx->data is a new copy. Returns 0, or -1 with err set
   (wrong magic, dimensions out of range, truncated data, trailing bytes, corrupt gzip). */
AUTODIFF_API int ad_idx_parse_memory(const void *bytes, size_t len, ad_idx *idx, char *err,
                                     size_t errlen);
/* The same for a file; err names the file. */
AUTODIFF_API int ad_idx_load(const char *path, ad_idx *idx, char *err, size_t errlen);
/* Frees idx->data and zeroes idx. NULL is allowed. */
AUTODIFF_API void ad_idx_free(ad_idx *idx);

/* A dataset from an IDX image file and (optionally, may be NULL) a label file with the same
   count: samples [1, rows, cols] scaled from 0..255 to [0, 1], classes = largest label + 1. */
AUTODIFF_API int ad_dataset_from_idx(const ad_idx *images, const ad_idx *labels, ad_dataset *ds,
                                     char *err, size_t errlen);
/* Loads MNIST-format data (MNIST, Fashion-MNIST) from folder dir: split "train" or "t10k" reads
   <split>-images-idx3-ubyte and <split>-labels-idx1-ubyte, each raw or with .gz appended (the raw
   file is preferred). Fails when a file is missing or the counts differ. */
AUTODIFF_API int ad_mnist_load(const char *dir, const char *split, ad_dataset *ds, char *err,
                               size_t errlen);
/* Loads a folder of images with one subfolder per class: root/<class>/<file>.png|.jpg|.jpeg|.bmp.
   Classes are the subfolder names in strcmp order (class index = position, names kept in
   ds->class_names); files are read in name order; names starting with '.' are skipped.
   channels: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA. height and width: both 0 to take the first
   image's size and refuse any image of another size, or both > 0 to resize every image that
   differs (ad_image_resize). Needs stb_image and <dirent.h> (POSIX; define AUTODIFF_NO_DIRENT
   where it is missing, and this function then returns an error). */
AUTODIFF_API int ad_folder_load(const char *root, int channels, int height, int width,
                                ad_dataset *ds, char *err, size_t errlen);
/* Frees everything a dataset owns and zeroes it. NULL is allowed. */
AUTODIFF_API void ad_dataset_free(ad_dataset *ds);

/* Decodes an image (any format stb_image reads: PNG, JPEG, BMP, GIF, TGA, PNM, ...) into
   [channels, height, width] values in [0, 1]; stb_image converts to the requested channels
   (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA). An image whose header declares more values than
   AUTODIFF_DATA_MAX_BYTES holds is refused before decoding. Returns 0, or -1 with err set. */
AUTODIFF_API int ad_image_load(const char *path, int channels, ad_image *img, char *err,
                               size_t errlen);
AUTODIFF_API int ad_image_load_memory(const void *bytes, size_t len, int channels, ad_image *img,
                                      char *err, size_t errlen);
/* Resizes src to height x width into dst (a new image). Each axis is averaged over the covered
   input area when it shrinks and interpolated linearly between pixel centres when it grows;
   every output value lies within the range of the inputs it is made from, so values in [0, 1]
   stay in [0, 1]. dst may be src: the old pixels are then freed. On failure dst is zeroed
   (left as it was when it is src). */
AUTODIFF_API int ad_image_resize(const ad_image *src, int height, int width, ad_image *dst,
                                 char *err, size_t errlen);
/* Frees img->data and zeroes img. NULL is allowed. */
AUTODIFF_API void ad_image_free(ad_image *img);

/* Prepares to walk ds (which must outlive the batcher) in batches of batch_size samples; flags
   are AD_BATCH_SHUFFLE and AD_BATCH_DROP_LAST. The order depends only on seed. The first epoch
   starts at once. Returns 0, or -1 with err set (empty dataset, batch_size < 1, no memory). */
AUTODIFF_API int ad_batcher_init(ad_batcher *b, const ad_dataset *ds, int batch_size, int flags,
                                 uint64_t seed, char *err, size_t errlen);
/* Copies the next batch of the epoch into x (room for batch_size * ds->sample_size values) and
   labels (batch_size ints); either may be NULL. Returns the number of samples in the batch: the
   last one of an epoch may be smaller (unless AD_BATCH_DROP_LAST), 0 when the epoch is over. */
AUTODIFF_API int ad_batcher_next(ad_batcher *b, ad_real *x, int *labels);
/* Starts a new epoch (with a new order when shuffling). */
AUTODIFF_API void ad_batcher_reset(ad_batcher *b);
/* Frees the batcher's memory (not the dataset) and zeroes it. NULL is allowed. */
AUTODIFF_API void ad_batcher_free(ad_batcher *b);
/* A batcher's position as AD_BATCHER_STATE_BYTES portable bytes (little-endian): the dataset
   size, batch size and flags it was made with, the random state that its epoch's order was
   drawn from, and the next position in that order. Keep them with a checkpoint
   (ad_params_set_extra) to continue training exactly where it stopped. */
#define AD_BATCHER_STATE_BYTES 56
AUTODIFF_API void ad_batcher_get_state(const ad_batcher *b, unsigned char state[AD_BATCHER_STATE_BYTES]);
/* Puts b, made by ad_batcher_init for a dataset of the same size with the same batch size and
   flags, at the position that state (len bytes from ad_batcher_get_state) describes: the next
   ad_batcher_next returns the batch that came next then, and later epochs follow in the same
   orders. Returns 0, or -1 with err set and b unchanged. */
AUTODIFF_API int ad_batcher_set_state(ad_batcher *b, const unsigned char *state, size_t len, char *err,
                                      size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* AUTODIFF_H */

/* >>impl =================================================================================== */
#ifdef AUTODIFF_IMPLEMENTATION
#ifndef AUTODIFF_IMPLEMENTATION_DONE
#define AUTODIFF_IMPLEMENTATION_DONE

/* GCC before 13 vectorises at -O2 only loops whose trip count it knows; the kernels below have
   run-time lengths, so the implementation asks for the usual cost model (restored at the end). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__INTEL_COMPILER)
#pragma GCC push_options
#pragma GCC optimize("vect-cost-model=dynamic")
#define AD__POP_OPTIONS 1
#endif

#if defined(AUTODIFF_MALLOC) && defined(AUTODIFF_REALLOC) && defined(AUTODIFF_FREE)
/* the user's allocator */
#elif !defined(AUTODIFF_MALLOC) && !defined(AUTODIFF_REALLOC) && !defined(AUTODIFF_FREE)
#define AUTODIFF_MALLOC(sz) malloc(sz)
#define AUTODIFF_REALLOC(p, sz) realloc(p, sz)
#define AUTODIFF_FREE(p) free(p)
#else
#error "autodiff.h: define all of AUTODIFF_MALLOC, AUTODIFF_REALLOC and AUTODIFF_FREE, or none"
#endif

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
/* folders: datasets of image folders, and the leftovers of killed checkpoint saves */
#if !defined(AUTODIFF_NO_DIRENT) && \
    (defined(__unix__) || defined(__unix) || defined(__APPLE__) || defined(__MINGW32__))
#include <dirent.h>
#include <sys/stat.h>
#define AD__HAS_DIRENT 1
#else
#define AD__HAS_DIRENT 0
#endif

#ifndef AUTODIFF_ASSERT
#include <assert.h>
#define AUTODIFF_ASSERT(c) assert(c)
#endif

/* >>impl:platform ---------------------------------------------------------------------------- */
#if defined(__GNUC__) || defined(__clang__)
#define AD__UNUSED __attribute__((unused))
#define AD__NOINLINE __attribute__((noinline))
#define AD__ALWAYS_INLINE __attribute__((always_inline))
/* on a hot function: its code starts on a cache line, so that its loops do not shift with
   the code before it (a shift costs a micro-kernel's loop an extra fetch each iteration) */
#define AD__CODE_ALIGN __attribute__((aligned(64)))
#define AD__RESTRICT __restrict__
#define AD__INLINE_KEYWORD __inline__
#define AD__HAS_VECTOR_EXT 1
/* a hint that p will be read soon; it never faults */
#define AD__PREFETCH_READ(p) __builtin_prefetch((p), 0, 0)
#elif defined(_MSC_VER)
#define AD__UNUSED
#define AD__NOINLINE __declspec(noinline)
#define AD__ALWAYS_INLINE
#define AD__CODE_ALIGN
#define AD__RESTRICT __restrict
#define AD__INLINE_KEYWORD __inline
#else
#define AD__UNUSED
#define AD__NOINLINE
#define AD__ALWAYS_INLINE
#define AD__CODE_ALIGN
#define AD__RESTRICT
#define AD__INLINE_KEYWORD
#endif
#if !defined(AD__PREFETCH_READ)
#define AD__PREFETCH_READ(p) ((void)(p))
#endif
#if !defined(AD__HAS_VECTOR_EXT)
#define AD__HAS_VECTOR_EXT 0
#endif
#if AD__HAS_VECTOR_EXT && (defined(__x86_64__) || defined(__i386__)) && !defined(AUTODIFF_NO_DISPATCH)
#define AD__X86_DISPATCH 1
/* GCC 12's AVX-512 intrinsics initialise a variable from itself (GCC bug 105593), which g++
   reports as maybe uninitialised wherever one is inlined; the headers of later releases turn
   the warning off around them, as this does. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h> /* for the few steps vector extensions do not name */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include <cpuid.h> /* the cache sizes the GEMM's blocking is chosen by */
#else
#define AD__X86_DISPATCH 0
#endif
/* bfloat16 products (ad_set_matmul_precision) are of floats only; a tape's kind of them: */
#if !defined(AUTODIFF_DOUBLE)
#define AD__GEMM_BF16 1
#else
#define AD__GEMM_BF16 0
#endif
enum {
    AD__BF16_OFF = 0,            /* products in ad_real */
    AD__BF16_VECTORS = 1,        /* bfloat16, with vector kernels */
    AD__BF16_AMX = 2             /* bfloat16, with AMX's tiles */
};
/* AVX512-BF16's dot product, for bfloat16 products of floats: through its intrinsic (immintrin.h,
   included with AD__X86_DISPATCH), which GCC has from version 10 and clang from 9 */
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE) && \
    ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10))
#define AD__HAS_BF16_INSTRUCTION 1
#else
#define AD__HAS_BF16_INSTRUCTION 0
#endif
/* AMX tiles for bfloat16 products: x86-64 Linux (which grants their state on request), GCC 11 or
   clang 12 and later */
#if AD__HAS_BF16_INSTRUCTION && defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define AD__HAS_AMX 1
#else
#define AD__HAS_AMX 0
#endif
/* The processor's features that kernels are chosen by: the one probe of the processor (libgcc's,
   made when the program starts) that every choice reads. ad__isa_features() holds the vector
   level (AD__ISA_LEVEL bits) and extensions beside it: AVX512-BF16, for bfloat16 products.
   AVX-512 counts only with AVX2 and FMA, which its kernels use too. */
enum {
    AD__ISA_PLAIN = 0,
    AD__ISA_AVX2 = 1,
    AD__ISA_AVX512 = 2,
    AD__ISA_LEVEL = 3,           /* the bits of the level */
    AD__ISA_BF16 = 4             /* AVX512-BF16, with AD__ISA_AVX512 */
};

/* the vector level: AD__ISA_PLAIN, AD__ISA_AVX2 or AD__ISA_AVX512 (read on every op's kernel
   choice, so it asks for nothing more) */
static AD__UNUSED int ad__isa(void)
{
#if AD__X86_DISPATCH
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && __builtin_cpu_supports("avx512f")) return AD__ISA_AVX512;
    if (avx2) return AD__ISA_AVX2;
#endif
    return AD__ISA_PLAIN;
}

/* the level and the extensions beside it */
static AD__UNUSED int ad__isa_features(void)
{
    int level = ad__isa();
#if AD__X86_DISPATCH
    if (level == AD__ISA_AVX512 && __builtin_cpu_supports("avx512bf16")) return level | AD__ISA_BF16;
#endif
    return level;
}

/* vector shuffles with constant lane lists (clang, GCC 12 and later) */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define AD__HAS_SHUFFLE 1
#endif
#endif
#if !defined(AD__HAS_SHUFFLE)
#define AD__HAS_SHUFFLE 0
#endif
#define AD__PRIVATE static AD__UNUSED
/* the rare branch of a hot function, kept out of it so that its fast path stays short */
#define AD__COLD static AD__NOINLINE AD__UNUSED
/* a fast path, inlined into its callers whatever the compiler's estimate of its size */
#define AD__HOT static AD__INLINE_KEYWORD AD__ALWAYS_INLINE AD__UNUSED
/* small functions on every op's path: allocation, recording, gradient slots */
#define AD__INLINE static AD__INLINE_KEYWORD AD__UNUSED

#ifdef AUTODIFF_DOUBLE
#define AD__F(name) name
#else
#define AD__F(name) name##f
#endif

#define AD__ALIGN 64

/* Tuning: each number trades one cost against another; none changes a result. They are set
   for machines like the project's test machine (a few cores with 1-2 MiB of cache each);
   README's speed section and `make bench` hold the measurements.
   memory */
#define AD__CHUNK_BYTES ((size_t)1 << 20)       /* an arena's chunk: fewer allocations, against
                                                   memory a small tape holds */
#define AD__HEADS_CHUNK_BYTES ((size_t)64 << 10) /* the same for tensor headers */
#define AD__HEADS_RING 4                         /* generations of headers before their places
                                                    come back: how long a stale tensor is surely
                                                    caught, against the cache lines a scalar
                                                    tape touches (see ad_tape_reset) */
/* threads: a split must save more than handing the work over, the other core fetching its
   operands, and the wait at the end cost */
#define AD__SPINS 16384                          /* rounds a worker spins for the next job before
                                                    it sleeps: a quick start against burnt cycles */
#define AD__YIELD_EVERY 64                       /* spin rounds between giving up the processor */
#define AD__RANGE_TASKS 4                        /* stretches per thread: balance when a thread is
                                                    held up, against hand-overs */
#define AD__SPLIT_HEAVY ((size_t)1 << 15)        /* values of an elementwise function that costs a
                                                    series or a library call each (exp, sin) from
                                                    which it is split */
#define AD__SPLIT_LIGHT ((size_t)1 << 16)        /* the same for one that costs a compare or a
                                                    multiply, whose time goes to moving values */
#define AD__SPLIT_MACS 524288.0                  /* multiply-adds of a product from which it is
                                                    split */
#define AD__THIN_SPLIT_MACS 131072.0             /* the same for a thin product (ad__gemm_thin),
                                                    which runs near its memory's speed */
#define AD__SHARE_MACS 33554432.0                /* multiply-adds from which a product's threads
                                                    share one packed block of B: one hand-over
                                                    more per block against packing it twice */
#define AD__KSPLIT_MAX_C 32768.0                 /* largest output (a 512-wide layer's at batch 64) */
#define AD__KSPLIT_MAX_BLOCKS 16                 /* and most blocks of a product split along its
                                                    inner dimension (buffers) */
#define AD__STORE_SPLIT ((size_t)1 << 16)        /* scalars of a store from which an optimizer step
                                                    or zero_grad is split */
#define AD__GATHER_SPLIT ((size_t)1 << 15)       /* values of a row gather from which it is split:
                                                    cores fetching rows from memory at once */
/* kernels */
#define AD__KC_MAX 512                           /* GEMM blocking: a KC x NC panel of B in L2/L3, */
#define AD__MC 144                               /* an MC x KC block of A in L2, KC chosen at run */
#define AD__NC 2048                              /* time from L2's size (ad__gemm_kc_limit), at most
                                                    AD__KC_MAX */
#define AD__KC_UNKNOWN_L2 256                    /* KC where L2's size is not known */
#define AD__KC_SMALL_C 256                       /* the longest K that a product with a C small
                                                    enough to be split along K keeps in one block */
#define AD__PANEL 64                             /* columns a reduction along a middle axis keeps
                                                    running values for: whole rows read, against
                                                    registers and stack */
#define AD__GATHER_AHEAD 32                      /* rows ahead a gather of long rows asks for each
                                                    row's first line: latency hidden against
                                                    lines fetched too early */
#define AD__ZERO_PIECE 2048                      /* scalars Adam updates before zeroing their
                                                    gradients (zero_grad), so they are still in
                                                    the first-level cache */
#define AD__ATTN_BLOCK 64                        /* query rows, and keys, of one block of the fused
                                                    attention: its score block stays in the first
                                                    level cache, against more passes of the
                                                    running softmax and smaller products */
#define AD__ATTN_BLOCK_CAUSAL 32                 /* the same with the causal mask: more of the
                                                    masked triangle skipped, against smaller
                                                    products */
#define AD__RNN_CHUNK_ROWS 512                   /* rows of a recurrent layer's input product
                                                    when the tape keeps nothing for a backward
                                                    sweep: a few steps' gates held, not the
                                                    sequence's, against smaller products */
#define AD__NORM_ROWS 16                         /* rows of a layer norm's backward whose shares
                                                    of dgamma and dbeta are summed together: the
                                                    split over threads is in whole such blocks */
#define AD__COL2IM_CHANNELS 8                    /* channels whose rows col2im sums side by side
                                                    with AVX-512, so that their adds overlap */
#define AD__COL2IM_MIN_CHANNELS 4                /* and does so from this many channels (with
                                                    fewer, a row's adds wait on each other) */
#define AD__COL2IM_MAX_WIDTH 16                  /* on rows of at most this many values (longer
                                                    rows give the portable loop long runs) */
#define AD__STRAIGHT_IMAGES 16                   /* convolutions of larger images go straight from */
#define AD__STRAIGHT_FLOATS 262144.0             /* the images in batches of this many, when each
                                                    image's im2col matrix has at most this many
                                                    values (1 MiB in float, a thread) */
#define AD__BF16_STRAIGHT_OUTPUTS 64             /* most output channels of a convolution that
                                                    goes straight from the images with bfloat16
                                                    products (see ad__conv_straight) */
#define AD__CONV_OUTPUTS 8                       /* output channels and vectors of positions whose */
#define AD__CONV_VECTORS 3                       /* convolutions straight from the image are
                                                    summed side by side with AVX-512: 24 of its 32
                                                    registers (AVX2: half the channels, by three
                                                    vectors of its width, 12 of 16) */
#define AD__STRAIGHT_AVX2_OUTPUTS (AD__CONV_OUTPUTS / 2) /* AVX2's half of those channels */
#define AD__IGRAD_TAPS 8                         /* taps whose input gradients straight from the
                                                    output gradient are summed side by side with
                                                    AVX-512, by AD__CONV_VECTORS vectors */
#define AD__IGRAD_MAX_OUTPUTS 64                 /* most output channels of a convolution whose
                                                    input gradient goes straight from the output
                                                    gradient (see ad__conv_input_straight) */
#define AD__WGRAD_OUTPUTS 8                      /* output channels and neighbouring taps whose */
#define AD__WGRAD_TAPS 3                         /* weight gradients are summed side by side (the
                                                    same 24; AVX2: half the channels, 12) */
#define AD__WGRAD_CHUNK_BYTES 24576              /* the images whose gradients and inputs of those
                                                    channels fit this are summed before one
                                                    reduction of the lanes: kept in L1 */
#define AD__WGRAD_KEEP_BYTES 524288              /* AVX-512 keeps each block's sums as vectors
                                                    from chunk to chunk of a part when all blocks'
                                                    fit this (a quarter of a 2 MiB L2) */

#if defined(__GNUC__) || defined(__clang__)
#define AD__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define AD__PRINTF(a, b)
#endif

/* Writes the reason into err (errlen bytes, always terminated; err may be NULL) and returns -1:
   the errors of functions that have neither a tape nor a store. */
AD__PRIVATE AD__PRINTF(3, 4) int ad__fail_into(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Reads the whole file at path into a new buffer (*len bytes; never NULL on success). A file
   longer than limit bytes is refused without being read to the end, so a file's length costs
   no more memory than the caller accepts. Returns the buffer, or NULL with the reason written
   into why ("... is a folder, not a file"), to follow the path in a message. */
AD__PRIVATE unsigned char *ad__read_whole_file(const char *path, size_t limit, const char *limit_name, size_t *len,
                                               char *why, size_t cap)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL, *grown;
    size_t n = 0, size = 0, got = 1;
    int folder = 0;
    *len = 0;
#ifdef EISDIR
    folder = !f && errno == EISDIR;
#endif
    if (!f) {
        snprintf(why, cap, folder ? "is a folder, not a file" : "cannot be opened: %s", strerror(errno));
        return NULL;
    }
    why[0] = 0;
    while (got > 0) {
        if (n == size) {
            if (size > limit) {
                snprintf(why, cap, "is larger than %s (%zu bytes)", limit_name, limit);
                break;
            }
            size = size < 65536 ? 65536 : (size < limit / 2 ? 2 * size : limit + 1);
            if (size > limit + 1) size = limit + 1;
            if (!(grown = (unsigned char *)AUTODIFF_REALLOC(buf, size))) {
                snprintf(why, cap, "cannot be read: out of memory for %zu bytes", size);
                break;
            }
            buf = grown;
        }
        got = fread(buf + n, 1, size - n, f);
        n += got;
    }
    if (!why[0] && ferror(f)) {
#ifdef EISDIR
        folder = errno == EISDIR;
#endif
        snprintf(why, cap, folder ? "is a folder, not a file" : "cannot be read: %s", strerror(errno));
    }
    fclose(f);
    if (why[0]) {
        AUTODIFF_FREE(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* >>impl:arena ------------------------------------------------------------------------------- */
typedef struct ad__chunk {
    struct ad__chunk *next;
    unsigned char *base; /* AD__ALIGN-aligned start of the usable bytes */
    size_t cap, used;
} ad__chunk;

typedef struct ad__arena {
    ad__chunk *head, *cur;
    size_t done;  /* bytes used in the chunks before cur */
    size_t skip;  /* bytes left out at the start of the first chunk by the last reset */
    size_t peak;  /* the most in use at any earlier reset; see ad__arena_peak */
    size_t chunk; /* bytes of a new chunk, unless one allocation needs more; 0: AD__CHUNK_BYTES */
    unsigned turns; /* times round the ring of a tape's header arena (ad__heads_start) */
} ad__arena;

/* p moved up to the next AD__ALIGN-byte boundary (p itself when it is on one). */
AD__INLINE void *ad__align_up(void *p)
{
    return (void *)(((uintptr_t)p + AD__ALIGN - 1) & ~(uintptr_t)(AD__ALIGN - 1));
}

/* n values of ad_real rounded up to whole AD__ALIGN-byte lines: buffers laid one after another
   at that many values apart all start on a line when the first does. */
AD__INLINE size_t ad__whole_lines(size_t n)
{
    const size_t line = AD__ALIGN / sizeof(ad_real);
    return (n + line - 1) / line * line;
}

AD__PRIVATE ad__chunk *ad__chunk_new(size_t cap)
{
    ad__chunk *c;
    if (cap > (size_t)-1 - sizeof(ad__chunk) - 2 * AD__ALIGN) return NULL;
    cap = (cap + AD__ALIGN - 1) & ~(size_t)(AD__ALIGN - 1); /* so an aligned start never passes cap */
    c = (ad__chunk *)AUTODIFF_MALLOC(sizeof(ad__chunk) + cap + AD__ALIGN);
    if (!c) return NULL;
    c->next = NULL;
    c->base = (unsigned char *)ad__align_up(c + 1);
    c->cap = cap;
    c->used = 0;
    return c;
}

/* Moves on to a kept chunk that can hold bytes (the chunks after the current one are all free:
   the first that is big enough is moved up to follow the current one), or links a new chunk in
   after the current one when none is. Data never moves. Returns 0 when memory runs out. */
AD__PRIVATE int ad__arena_advance(ad__arena *A, size_t bytes)
{
    ad__chunk **link, **at, *next;
    if (A->cur == A->head && A->cur && A->cur->used == A->skip) { /* reset: all chunks are free */
        A->cur = NULL;
        A->skip = 0;
    }
    link = A->cur ? &A->cur->next : &A->head;
    at = link;
    while (*at && (*at)->cap < bytes) at = &(*at)->next;
    if (*at) {
        next = *at;
        *at = next->next; /* unlink, then put it first among the free chunks */
    } else {
        size_t chunk = A->chunk ? A->chunk : AD__CHUNK_BYTES;
        next = ad__chunk_new(bytes > chunk ? bytes : chunk);
        if (!next) return 0;
    }
    next->next = *link;
    *link = next;
    if (A->cur) A->done += A->cur->used;
    A->cur = next;
    A->cur->used = 0;
    return 1;
}

/* The allocation that does not fit in the current chunk: bytes at the start of another one. */
AD__PRIVATE void *ad__arena_alloc_in_next(ad__arena *A, size_t bytes)
{
    if (bytes > (size_t)-1 / 2) return NULL;
    bytes = (bytes + 15) & ~(size_t)15;
    if (!ad__arena_advance(A, bytes)) return NULL;
    A->cur->used = bytes;
    return A->cur->base;
}

/* Bump allocation of bytes at the given alignment (a power of two, 16 to AD__ALIGN). Blocks are
   multiples of 16 bytes, so used stays a multiple of 16 and, chunks being multiples of
   AD__ALIGN, an aligned start never passes cap. ad__arena_alloc_here is the part that stays in
   the current chunk: NULL when the block does not fit there. */
AD__INLINE void *ad__arena_alloc_here(ad__arena *A, size_t bytes, size_t align)
{
    ad__chunk *c = A->cur;
    if (c) {
        size_t start = align <= 16 ? c->used : (c->used + align - 1) & ~(align - 1);
        if (bytes <= c->cap - start) {
            c->used = start + ((bytes + 15) & ~(size_t)15);
            return c->base + start;
        }
    }
    return NULL;
}

AD__INLINE void *ad__arena_alloc(ad__arena *A, size_t bytes, size_t align)
{
    void *p = ad__arena_alloc_here(A, bytes, align);
    return p ? p : ad__arena_alloc_in_next(A, bytes);
}

/* Bytes in use, counting the padding that alignment skipped (not the unused ends of chunks). */
AD__PRIVATE size_t ad__arena_in_use(const ad__arena *A)
{
    return A->cur ? A->done + A->cur->used - A->skip : 0;
}

/* The most bytes ever in use. Use only grows between resets, so the peak is the larger of the
   use now and the use at the resets, which ad__arena_reset keeps. */
AD__PRIVATE size_t ad__arena_peak(const ad__arena *A)
{
    size_t now = ad__arena_in_use(A);
    return now > A->peak ? now : A->peak;
}

/* Rewinds to skip bytes (a multiple of 16 below the chunk size) into the first chunk, so that
   the next allocation is a plain bump when it fits there (when it does not, ad__arena_advance
   chooses among all the chunks). */
AD__PRIVATE void ad__arena_reset(ad__arena *A, size_t skip)
{
    A->peak = ad__arena_peak(A);
    A->cur = A->head;
    A->skip = A->cur ? skip : 0;
    if (A->cur) A->cur->used = A->skip;
    A->done = 0;
}

AD__PRIVATE void ad__arena_free(ad__arena *A)
{
    ad__chunk *c = A->head;
    while (c) {
        ad__chunk *next = c->next;
        AUTODIFF_FREE(c);
        c = next;
    }
    A->head = A->cur = NULL;
}

/* >>impl:threads ----------------------------------------------------------------------------- */
/* A fork-join pool: ad__parallel runs fn(ctx, task, thread) for task = 0..ntasks-1 on the workers
   and the caller, and returns when all are done. Which thread runs which task varies; callers
   make every task write its own outputs, so results never depend on the thread count. */
typedef void (*ad__task_fn)(void *ctx, int task, int thread);

/* Threads need POSIX threads and the GCC/Clang __atomic builtins. */
#if defined(AUTODIFF_NO_THREADS) || !(defined(__unix__) || defined(__APPLE__)) || !defined(__GNUC__)
#define AD__THREADS 0
#else
#define AD__THREADS 1
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

#if AD__THREADS
/* Jobs come in quick succession during a training step, and waking a sleeping thread costs tens
   of microseconds, more than a mid-sized product takes. So a worker that finishes a job spins
   for a while (AD__SPINS rounds of a pause instruction, about 1 ms on a recent x86, long enough
   to span the optimizer step between two training steps) watching for the next one, and only
   then sleeps on a condition variable.

   Tasks are claimed through one word: the job's number in the high half, the next task in the
   low half. A worker reads the word, then the job's description, then claims a task with a
   compare-and-swap that succeeds only while the word is unchanged, so a worker that read a stale
   description never runs it. Before rewriting the description the caller marks the word with the
   new job's number and AD__UNPUBLISHED, which makes every stale claim fail; the description is
   written with release stores, so a worker that sees any of it also sees that mark.
   Spinning threads give up the processor every AD__YIELD_EVERY rounds: when the machine has
   more runnable threads than cores, a worker spinning on the core of the thread it waits for
   would otherwise slow that thread down instead of helping it. */
#define AD__UNPUBLISHED 0xffffffffull
#define AD__TASK_MASK 0xffffffffull

#if defined(__x86_64__) || defined(__i386__)
#define AD__CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define AD__CPU_RELAX() __asm__ __volatile__("yield")
#else
#define AD__CPU_RELAX() ((void)0)
#endif

typedef struct ad__pool {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t *workers;
    int nworkers;
    unsigned long long claim;    /* job number << 32 | next task; AD__UNPUBLISHED while written */
    ad__task_fn fn;              /* the current job */
    void *ctx;
    int ntasks;
    int finished;                /* tasks of the current job done */
    int sleepers;                /* workers waiting on wake */
    int stop;
} ad__pool;

typedef struct ad__worker_arg {
    ad__pool *pool;
    int thread;
} ad__worker_arg;

/* Claims and runs tasks of the job whose claim word was read as `word` until none is left or a
   newer job replaces it. */
AD__PRIVATE void ad__pool_work(ad__pool *P, unsigned long long word, int thread)
{
    for (;;) {
        ad__task_fn fn = __atomic_load_n(&P->fn, __ATOMIC_ACQUIRE);
        void *ctx = __atomic_load_n(&P->ctx, __ATOMIC_ACQUIRE);
        int ntasks = __atomic_load_n(&P->ntasks, __ATOMIC_ACQUIRE);
        unsigned long long task = word & AD__TASK_MASK;
        if (task == AD__UNPUBLISHED || task >= (unsigned long long)ntasks) return;
        if (__atomic_compare_exchange_n(&P->claim, &word, word + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            fn(ctx, (int)task, thread);
            __atomic_fetch_add(&P->finished, 1, __ATOMIC_RELEASE);
            word++;
        }
        /* on failure word now holds the current claim word; a different job number ends this one */
    }
}

/* Waits until the claim word shows a published job newer than `seen`, or the pool stops;
   returns the word (0 when stopping). */
AD__PRIVATE unsigned long long ad__pool_wait(ad__pool *P, unsigned long long seen)
{
    unsigned long long word;
    int spin;
#define AD__IS_NEW(w) ((w) >> 32 != seen && ((w) & AD__TASK_MASK) != AD__UNPUBLISHED)
    for (spin = 1; spin <= AD__SPINS; spin++) {
        word = __atomic_load_n(&P->claim, __ATOMIC_ACQUIRE);
        if (AD__IS_NEW(word) || __atomic_load_n(&P->stop, __ATOMIC_ACQUIRE)) return word;
        if (spin % AD__YIELD_EVERY == 0) sched_yield(); else AD__CPU_RELAX();
    }
    pthread_mutex_lock(&P->mu);
    __atomic_fetch_add(&P->sleepers, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        word = __atomic_load_n(&P->claim, __ATOMIC_SEQ_CST);
        if (AD__IS_NEW(word) || __atomic_load_n(&P->stop, __ATOMIC_SEQ_CST)) break;
        pthread_cond_wait(&P->wake, &P->mu);
    }
    __atomic_fetch_sub(&P->sleepers, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&P->mu);
#undef AD__IS_NEW
    return word;
}

AD__PRIVATE void *ad__worker_main(void *arg)
{
    ad__pool *P = ((ad__worker_arg *)arg)->pool;
    int thread = ((ad__worker_arg *)arg)->thread;
    unsigned long long seen = 0;
    AUTODIFF_FREE(arg);
    for (;;) {
        unsigned long long word = ad__pool_wait(P, seen);
        if (__atomic_load_n(&P->stop, __ATOMIC_ACQUIRE)) break;
        seen = word >> 32;
        ad__pool_work(P, word, thread);
    }
    return NULL;
}

/* Wakes workers that went to sleep; called after a change they wait for. The sleepers count and
   the claim word are both sequentially consistent, so either the caller sees a worker counted
   here, or that worker sees the change before it sleeps. */
AD__PRIVATE void ad__pool_wake(ad__pool *P)
{
    if (__atomic_load_n(&P->sleepers, __ATOMIC_SEQ_CST) == 0) return;
    pthread_mutex_lock(&P->mu);
    pthread_cond_broadcast(&P->wake);
    pthread_mutex_unlock(&P->mu);
}

AD__PRIVATE void ad__pool_free(struct ad__pool *P)
{
    int i;
    if (!P) return;
    __atomic_store_n(&P->stop, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&P->mu);
    pthread_cond_broadcast(&P->wake);
    pthread_mutex_unlock(&P->mu);
    for (i = 0; i < P->nworkers; i++) pthread_join(P->workers[i], NULL);
    pthread_mutex_destroy(&P->mu);
    pthread_cond_destroy(&P->wake);
    AUTODIFF_FREE(P->workers);
    AUTODIFF_FREE(P);
}

/* A pool with nworkers threads besides the caller; NULL when threads cannot be made. */
AD__PRIVATE ad__pool *ad__pool_new(int nworkers)
{
    ad__pool *P = (ad__pool *)AUTODIFF_MALLOC(sizeof(ad__pool));
    int i;
    if (!P) return NULL;
    memset(P, 0, sizeof *P);
    P->workers = (pthread_t *)AUTODIFF_MALLOC((size_t)nworkers * sizeof(pthread_t));
    if (!P->workers) { AUTODIFF_FREE(P); return NULL; }
    pthread_mutex_init(&P->mu, NULL);
    pthread_cond_init(&P->wake, NULL);
    for (i = 0; i < nworkers; i++) {
        ad__worker_arg *arg = (ad__worker_arg *)AUTODIFF_MALLOC(sizeof(ad__worker_arg));
        if (!arg) break;
        arg->pool = P;
        arg->thread = i + 1;
        if (pthread_create(&P->workers[i], NULL, ad__worker_main, arg) != 0) {
            AUTODIFF_FREE(arg);
            break;
        }
        P->nworkers++;
    }
    if (P->nworkers == 0) {
        ad__pool_free(P);
        return NULL;
    }
    return P;
}

AD__PRIVATE int ad__default_threads(void)
{
    const char *env = getenv("AUTODIFF_THREADS");
    long n = env ? strtol(env, NULL, 10) : 0;
    if (n < 1) n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    return n > 256 ? 256 : (int)n;
}
#else
struct ad__pool;
AD__PRIVATE void ad__pool_free(struct ad__pool *P) { (void)P; }
AD__PRIVATE int ad__default_threads(void) { return 1; }
#endif

/* >>impl:tape -------------------------------------------------------------------------------- */
typedef struct ad__sweep ad__sweep;
typedef struct ad__node ad__node;
/* Adds the gradients of n's inputs, given g = d y / d n->out, through ad__accum. */
typedef void (*ad__backward_fn)(ad__sweep *S, ad__node *n, ad_tensor *g);

/* What an entry's backward needs besides its inputs and output, one struct per family of ops,
   kept in the entry itself so that recording an op allocates nothing more. Each is written by
   its op's forward and read by its backward, and only by them. */
typedef struct ad__unary_state {
    int kind;                    /* the row of AD__UNARY_OPS */
    ad_real p0, p1;              /* its parameters (a slope, a scale and shift, an exponent) */
    const ad_real *deriv;        /* f'(x) of every value, saved by the forward (GELU's), or NULL */
} ad__unary_state;
typedef struct ad__binary_state {
    int kind;                    /* the row of AD__BINARY_OPS */
} ad__binary_state;
typedef struct ad__reduce_state {
    int kind;                    /* the row of AD__REDUCE_OPS */
    int axis;                    /* -1: the whole tensor */
    ad_real param;               /* the row's setting: 1 / n for a mean, n - correction for a
                                    variance, else 1 */
} ad__reduce_state;
typedef struct ad__permute_state {
    int perm[AD_MAX_DIMS];
} ad__permute_state;
typedef struct ad__slice_state { /* ad_slice, its adjoint (padding one axis) and ad_concat */
    int axis, start;
} ad__slice_state;
typedef struct ad__broadcast_state {
    int reduce;                  /* 1: the sum back to a smaller shape (the adjoint) */
} ad__broadcast_state;
typedef struct ad__matmul_state {
    int trans_a, trans_b;
} ad__matmul_state;
typedef struct ad__softmax_state {
    int axis, log_form;
} ad__softmax_state;
typedef struct ad__conv_state {
    int kind;                    /* enum ad__conv_kind; the geometry is in ad__node.saved */
} ad__conv_state;
typedef struct ad__gather_state {
    const int *index;            /* on the tape: the source row of each result row */
    int rows, row_len;           /* rows of a source plane, and values per row */
    int kind;                    /* enum ad__gather_kind: the public op, for messages */
    int tiles;                   /* 1: max pooling in windows that meet each input cell at most
                                    once (ad__pool_2x2) */
} ad__gather_state;
typedef struct ad__avg_pool_state {
    int kind;                    /* enum ad__avg_kind; the geometry is in ad__node.saved */
} ad__avg_pool_state;
typedef struct ad__xent_state {
    const int *labels;           /* a copy on the tape */
} ad__xent_state;
typedef struct ad__rnn_state {   /* >>ops:rnn: a cell or a layer */
    int biases;                  /* 1: b_ih is an input, 2: b_hh is, 3: both (after the others) */
    const ad_real *gates;        /* on the tape: the activated gates, [N, 4H] i f g o (LSTM) or
                                    [N, 3H] r z n (GRU); a layer's, one such block per step */
    const ad_real *aux;          /* LSTM: tanh(c') [N, H]; GRU: h w_hh^T + b_hh [N, 3H]; the
                                    LSTM layer: tanh(c) [L, N, H], then c [L, N, H]; the GRU
                                    layer: h w_hh^T + b_hh [L, N, 3H] */
} ad__rnn_state;
typedef struct ad__rnn_part_state { /* a part of an LSTM's result, or the GRU layer's h_n */
    int start;                   /* its first row along the result's first axis */
} ad__rnn_part_state;
typedef struct ad__attention_state {
    const ad_real *lse;          /* on the tape, [B, H, Tq]: log of each query row's softmax sum */
    ad_real scale;
    int causal;
    int heads;                   /* ad_self_attention's heads; 0 for ad_attention */
} ad__attention_state;

typedef struct ad__norm_state {
    const ad_real *stats;        /* on the tape: the mean and 1 / sqrt(var + eps) of each row */
    size_t inner;                /* values per row: the normalised dimensions' product */
    ad_real eps;
} ad__norm_state;

typedef union ad__saved_state {
    ad__unary_state unary;
    ad__binary_state binary;
    ad__reduce_state reduce;
    ad__permute_state permute;
    ad__slice_state slice;
    ad__broadcast_state broadcast;
    ad__matmul_state matmul;
    ad__softmax_state softmax;
    ad__conv_state conv;
    ad__gather_state gather;
    ad__avg_pool_state avg_pool;
    ad__xent_state xent;
    ad__rnn_state rnn;
    ad__rnn_part_state rnn_part;
    ad__attention_state attention;
    ad__norm_state norm;
} ad__saved_state;

struct ad__node {
    ad__node *prev;              /* the entry recorded before this one */
    ad__backward_fn backward;
    ad_tensor *out;
    ad_tensor **in;
    int nin;
    unsigned char reads_held;    /* the form of a held output gradient (AD__GRAD_UNIFORM,
                                    AD__GRAD_VALUE) that backward reads as it is; 0: none */
    const char *op;              /* the public op's name, for anomaly messages and pictures
                                    (not set by the one-element binary ops: see ad__op_name) */
    ad__saved_state st;          /* what the backward needs, by the op's family */
    const void *saved;           /* larger state on the tape (a window's geometry, the
                                    settings of a reduction along an axis) */
    ad_tensor *in_inline[3];
};

/* The numbers of a tape (>>ops:numbers): one entry per place, place 0 standing for constants. */
typedef struct ad__num_entry {
    unsigned a, b;               /* the places of the inputs (0: a constant, or none) */
    ad_real da, db;              /* d result / d input, taken as the op ran */
} ad__num_entry;
/* A place's gradient from the last sweep that reached it, with that sweep's number. */
typedef struct ad__num_grad {
    ad_real value;
    unsigned sweep;
} ad__num_grad;
typedef struct ad__nums {
    ad__num_entry *entries;      /* [cap], in one block with grads */
    ad__num_grad *grads;         /* [cap] */
    unsigned sweep;              /* the last ad_num_backward's number: 1, 2, ..., never 0 */
    unsigned count;              /* places in use: 1 + the numbers recorded */
    unsigned cap;
    unsigned swept;              /* the places the last ad_num_backward covered */
    unsigned base;               /* the id of place 0: ids are base + place */
} ad__nums;

struct ad_tape {
    ad__arena arena;             /* tensors' values, tape entries, saved state */
    ad__arena heads;             /* tensor headers and one-element tensors: see ad_tape_reset */
    size_t peak;                 /* the most bytes in use in both at any earlier reset */
    ad__node *last;
    ad_tensor *leaves;           /* leaves that require grad, most recent first */
    unsigned ntensors;
    unsigned short gen;          /* resets so far (wrapping): tensors of earlier ones are stale */
    size_t nentries;
    int grad_enabled;
    int training;
    int has_error;
    int anomaly;                 /* ad_set_detect_anomaly: 1 on, 2 while a sweep runs */
    struct ad__mark *marks;      /* names, hooks and parameters of tensors: >>impl:hooks */
    ad__node sink;               /* receives saved values when an op is not recorded */
    ad_real *pack;               /* GEMM packing buffers, one per thread, kept across resets */
    size_t pack_cap;
    ad_real *panels;             /* operands packed once for many products: ad__panels_room */
    size_t panels_cap;
    int nthreads;                /* 0 until first asked: then the default */
    int bf16;                    /* ad_set_matmul_precision: AD__BF16_* */
    struct ad__pool *pool;
    ad__nums nums;               /* single numbers: >>ops:numbers */
    char error[320];
};

/* Records the first error of an object (a tape, a parameter store): later ones are dropped. */
AD__PRIVATE void ad__record_error(int *has_error, char *text, size_t cap, const char *fmt, va_list ap)
{
    if (*has_error) return;
    vsnprintf(text, cap, fmt, ap);
    *has_error = 1;
}

AD__PRIVATE void ad__fail(ad_tape *T, const char *fmt, ...)
{
    va_list ap;
    if (!T) return;
    va_start(ap, fmt);
    ad__record_error(&T->has_error, T->error, sizeof T->error, fmt, ap);
    va_end(ap);
}

AD__COLD void ad__on_tape_fail(ad_tape *T, const char *op, const char *what, const ad_tensor *x)
{
    if (x->tape == T)
        ad__fail(T, "%s: %s was made before the tape's last reset (tensors live until ad_tape_reset)", op, what);
    else ad__fail(T, "%s: %s belongs to another tape, or was made before the tape's last reset", op, what);
}

/* Whether x may be used by op on T: made on T since its last reset. Otherwise records an error
   that names op and what (the input's role, "weight", "the input") and returns 0. */
AD__HOT int ad__on_tape(ad_tape *T, const char *op, const char *what, const ad_tensor *x)
{
    if (x->tape == T && x->gen == T->gen) return 1;
    ad__on_tape_fail(T, op, what, x);
    return 0;
}

/* Tensors live until their tape's reset, but a program may keep a pointer longer; ops detect
   such a stale tensor by the generation (count of resets) in its header. That works while the
   header is not replaced by the header of a new tensor at the same address, which would make
   the stale pointer a live tensor. So headers (and one-element tensors, which are little
   more) have an arena of their own whose generations do not start at one place: each starts
   where the last one ended, in a ring of four generations' worth of the first chunk (small
   enough to stay in the L1 cache for a scalar tape), so a header's address comes back only
   after four resets, and then 48 bytes off on every other turn of the ring. Headers are 96
   bytes or more apart, so when a program repeats its steps no new header lands exactly on an
   old one for eight resets. A generation too large for the ring starts 0 or 48 bytes in, by
   turns. */

AD__PRIVATE size_t ad__heads_start(ad__arena *H, unsigned gen)
{
    size_t used = (ad__arena_in_use(H) + 15) & ~(size_t)15, next = H->skip + used;
    if (!H->head || H->cur != H->head) return gen & 1 ? 48 : 0;
    if (next + used <= AD__HEADS_RING * used && next + used <= H->head->cap) return next;
    H->turns++;
    return H->turns & 1 ? 48 : 0;
}

/* A tape's numbers at its start and at each reset (>>ops:numbers). */
AD__PRIVATE void ad__nums_init(ad_tape *T);
AD__PRIVATE void ad__nums_reset(ad__nums *N);

AUTODIFF_API ad_tape *ad_tape_new(void)
{
    ad_tape *T = (ad_tape *)AUTODIFF_MALLOC(sizeof(ad_tape));
    if (!T) return NULL;
    memset(T, 0, sizeof *T);
    T->heads.chunk = AD__HEADS_CHUNK_BYTES;
    T->grad_enabled = 1;
    T->training = 1;
    ad__nums_init(T);
    return T;
}

AUTODIFF_API void ad_tape_free(ad_tape *T)
{
    if (!T) return;
    ad__arena_free(&T->arena);
    ad__arena_free(&T->heads);
    ad__pool_free(T->pool);
    AUTODIFF_FREE(T->pack);
    AUTODIFF_FREE(T->panels);
    AUTODIFF_FREE(T->nums.entries);
    AUTODIFF_FREE(T);
}

/* Forgets T's tensors, entries and marks and rewinds its arenas (T->gen already moved on). Not
   inlined: a tape of numbers, reset after every few ops, does not need it, and the inlined body
   made each of its resets slower (bench/tape). */
AD__COLD void ad__tape_forget_tensors(ad_tape *T)
{
    T->peak = ad_tape_bytes_peak(T);
    ad__arena_reset(&T->arena, 0);
    ad__arena_reset(&T->heads, ad__heads_start(&T->heads, T->gen));
    T->last = NULL;
    T->leaves = NULL;
    T->marks = NULL;
    T->ntensors = 0;
    T->nentries = 0;
}

AUTODIFF_API void ad_tape_reset(ad_tape *T)
{
    if (!T) return;
    T->gen++;
    /* a tape of numbers only has nothing in its arenas to rewind */
    if (T->ntensors || T->nentries || T->marks || ad_tape_bytes_used(T)) ad__tape_forget_tensors(T);
    ad__nums_reset(&T->nums);
    T->has_error = 0;
    T->error[0] = 0;
}

AUTODIFF_API const char *ad_tape_error(const ad_tape *T)
{
    if (!T) return "autodiff: no tape (NULL)";
    return T->has_error ? T->error : NULL;
}

AUTODIFF_API void ad_tape_clear_error(ad_tape *T)
{
    if (!T) return;
    T->has_error = 0;
    T->error[0] = 0;
}

AUTODIFF_API int ad_set_grad_enabled(ad_tape *T, int enabled)
{
    int previous;
    if (!T) return 0;
    previous = T->grad_enabled;
    T->grad_enabled = enabled != 0;
    return previous;
}

AUTODIFF_API int ad_set_training(ad_tape *T, int training)
{
    int previous;
    if (!T) return 0;
    previous = T->training;
    T->training = training != 0;
    return previous;
}

AUTODIFF_API int ad_is_training(const ad_tape *T) { return T ? T->training : 0; }

#if AD__HAS_AMX
AD__PRIVATE int ad__amx_permitted(void);
#endif

AUTODIFF_API int ad_set_matmul_precision(ad_tape *T, int precision)
{
    int previous;
    if (!T) return -1;
    if (precision != AD_MATMUL_FLOAT32 && precision != AD_MATMUL_BFLOAT16) {
        ad__fail(T, "ad_set_matmul_precision: unknown precision %d (AD_MATMUL_FLOAT32 or AD_MATMUL_BFLOAT16)",
                 precision);
        return -1;
    }
    if (precision == AD_MATMUL_BFLOAT16 && !AD__GEMM_BF16) {
        ad__fail(T, "ad_set_matmul_precision: bfloat16 products need float tensors, and this build has "
                    "AUTODIFF_DOUBLE");
        return -1;
    }
    previous = T->bf16 ? AD_MATMUL_BFLOAT16 : AD_MATMUL_FLOAT32;
    T->bf16 = precision == AD_MATMUL_BFLOAT16 ? AD__BF16_VECTORS : AD__BF16_OFF;
#if AD__HAS_AMX
    /* the tiles where the processor has them and Linux lets the process use them */
    if (T->bf16 && ad__amx_permitted()) T->bf16 = AD__BF16_AMX;
#endif
    return previous;
}

AUTODIFF_API int ad_get_matmul_precision(const ad_tape *T)
{
    return T && T->bf16 ? AD_MATMUL_BFLOAT16 : AD_MATMUL_FLOAT32;
}

AUTODIFF_API size_t ad_tape_bytes_used(const ad_tape *T)
{
    return T ? ad__arena_in_use(&T->arena) + ad__arena_in_use(&T->heads) : 0;
}

/* Use only grows between resets, so the peak is the larger of the use now and at the resets. */
AUTODIFF_API size_t ad_tape_bytes_peak(const ad_tape *T)
{
    size_t now = ad_tape_bytes_used(T);
    return T && T->peak > now ? T->peak : now;
}
AUTODIFF_API size_t ad_tape_length(const ad_tape *T) { return T ? T->nentries : 0; }

AUTODIFF_API void ad_set_threads(ad_tape *T, int nthreads)
{
    if (!T) return;
    if (nthreads < 0) nthreads = 0;
    if (nthreads > 256) nthreads = 256;
    if (T->pool && nthreads != T->nthreads) {
        ad__pool_free(T->pool);
        T->pool = NULL;
    }
    T->nthreads = nthreads;
}

AUTODIFF_API int ad_get_threads(const ad_tape *T)
{
    if (!T) return 1;
    return T->nthreads ? T->nthreads : ad__default_threads();
}

/* Runs fn over ntasks tasks on up to the tape's thread count; serially when threads are off,
   when there is one task, or when the workers cannot be started. Returns the number of threads
   that may have run tasks (so callers can size per-thread scratch before calling). */
AD__PRIVATE int ad__thread_count(ad_tape *T)
{
    if (!T->nthreads) T->nthreads = ad__default_threads();
#if AD__THREADS
    if (T->nthreads > 1 && !T->pool) {
        T->pool = ad__pool_new(T->nthreads - 1);
        if (!T->pool) T->nthreads = 1;
    }
    return T->pool ? T->pool->nworkers + 1 : 1;
#else
    return 1;
#endif
}

AD__PRIVATE void ad__parallel(ad_tape *T, ad__task_fn fn, void *ctx, int ntasks)
{
#if AD__THREADS
    ad__pool *P = T->pool;
    if (P && ntasks > 1) {
        unsigned long long job = (__atomic_load_n(&P->claim, __ATOMIC_RELAXED) >> 32) + 1;
        int spin = 0;
        __atomic_store_n(&P->claim, job << 32 | AD__UNPUBLISHED, __ATOMIC_SEQ_CST);
        __atomic_store_n(&P->finished, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&P->fn, fn, __ATOMIC_RELEASE);
        __atomic_store_n(&P->ctx, ctx, __ATOMIC_RELEASE);
        __atomic_store_n(&P->ntasks, ntasks, __ATOMIC_RELEASE);
        __atomic_store_n(&P->claim, job << 32, __ATOMIC_SEQ_CST);
        ad__pool_wake(P);
        ad__pool_work(P, job << 32, 0);
        /* the other threads' last tasks are running: their ends are near */
        while (__atomic_load_n(&P->finished, __ATOMIC_ACQUIRE) < ntasks)
            if (++spin % AD__YIELD_EVERY == 0) sched_yield(); else AD__CPU_RELAX();
        return;
    }
#else
    (void)T;
#endif
    {
        int task;
        for (task = 0; task < ntasks; task++) fn(ctx, task, 0);
    }
}

/* Values of a loop split over threads are cut in blocks of this many (64 bytes of floats), so
   that no two threads write to one cache line, and at a multiple of every vector width, so
   that each value goes through the same lanes of the same code whatever the split. */
#define AD__STORE_BLOCK 16

/* The length of each of `tasks` stretches covering n items, in whole blocks of `block`. */
AD__INLINE size_t ad__stretch(size_t n, int tasks, size_t block)
{
    size_t blocks = (n + block - 1) / block;
    return (blocks + (size_t)tasks - 1) / (size_t)tasks * block;
}

/* Work on n independent items (values of an elementwise op, rows of a softmax), done as
   fn(ctx, lo, hi) on stretches of whole blocks of `block` items, AD__RANGE_TASKS per thread of
   the tape from min_split items on, and on the calling thread alone below that. Threads claim
   stretches as they come, so a thread the machine holds up leaves its other stretches to the
   rest. Each item is computed by the same code whatever the split, so results are identical
   for any thread count. */
typedef void (*ad__range_fn)(const void *ctx, size_t lo, size_t hi);

typedef struct ad__range_job {
    ad__range_fn fn;
    const void *ctx;
    size_t n, stretch;
} ad__range_job;

AD__PRIVATE void ad__range_task(void *ctx, int task, int thread)
{
    const ad__range_job *j = (const ad__range_job *)ctx;
    size_t lo = (size_t)task * j->stretch, hi = lo + j->stretch < j->n ? lo + j->stretch : j->n;
    (void)thread;
    if (lo < hi) j->fn(j->ctx, lo, hi);
}

AD__INLINE void ad__parallel_range(ad_tape *T, ad__range_fn fn, const void *ctx, size_t n, size_t min_split,
                                   size_t block)
{
    ad__range_job job;
    int threads = n >= min_split ? ad__thread_count(T) : 1;
    if (threads <= 1) {
        fn(ctx, 0, n);
        return;
    }
    job.fn = fn;
    job.ctx = ctx;
    job.n = n;
    job.stretch = ad__stretch(n, threads * AD__RANGE_TASKS, block);
    ad__parallel(T, ad__range_task, &job, (int)((n + job.stretch - 1) / job.stretch));
}

/* bytes from T's arena at the given alignment (16 to AD__ALIGN); NULL, with the error set,
   when memory runs out. */
AD__INLINE void *ad__alloc_aligned(ad_tape *T, size_t bytes, size_t align, const char *op)
{
    void *p = ad__arena_alloc(&T->arena, bytes, align);
    if (!p) ad__fail(T, "%s: out of memory allocating %zu bytes", op, bytes);
    return p;
}

AD__INLINE void *ad__alloc(ad_tape *T, size_t bytes, const char *op)
{
    return ad__alloc_aligned(T, bytes, AD__ALIGN, op);
}

/* bytes (16-aligned) for a tensor header or a one-element tensor, from T's header arena. */
AD__INLINE void *ad__alloc_head(ad_tape *T, size_t bytes, const char *op)
{
    void *p = ad__arena_alloc(&T->heads, bytes, 16);
    if (!p) ad__fail(T, "%s: out of memory allocating %zu bytes", op, bytes);
    return p;
}

/* >>impl:tensor ------------------------------------------------------------------------------ */
AUTODIFF_API char *ad_shape_str(const ad_tensor *x, char *buf, size_t cap)
{
    size_t len = 0;
    int i;
    if (!buf || cap == 0) return buf;
    buf[0] = 0;
    if (!x) { snprintf(buf, cap, "(null)"); return buf; }
    len += (size_t)snprintf(buf, cap, "[");
    for (i = 0; i < x->ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, i ? ",%d" : "%d", x->shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

/* The same for a bare shape. */
AD__PRIVATE char *ad__dims_str(int ndim, const int *shape, char *buf, size_t cap)
{
    ad_tensor t;
    int i;
    memset(&t, 0, sizeof t);
    t.ndim = ndim < 0 ? 0 : (ndim > AD_MAX_DIMS ? AD_MAX_DIMS : ndim);
    for (i = 0; i < t.ndim; i++) t.shape[i] = shape[i];
    return ad_shape_str(&t, buf, cap);
}

/* Checks a user-given shape; on success stores the element count in *size. */
AD__PRIVATE int ad__check_shape(ad_tape *T, const char *op, int ndim, const int *shape, size_t *size)
{
    size_t n = 1;
    int i;
    if (ndim < 0 || ndim > AD_MAX_DIMS) {
        ad__fail(T, "%s: %d dimensions; between 0 and %d are supported", op, ndim, AD_MAX_DIMS);
        return 0;
    }
    if (ndim > 0 && !shape) {
        ad__fail(T, "%s: shape is NULL for %d dimensions", op, ndim);
        return 0;
    }
    for (i = 0; i < ndim; i++) {
        if (shape[i] <= 0) {
            char s[96];
            ad__fail(T, "%s: shape %s: dimension %d is %d; dimensions must be positive", op,
                     ad__dims_str(ndim, shape, s, sizeof s), i, shape[i]);
            return 0;
        }
        if (n > ((size_t)-1 / sizeof(ad_real)) / (size_t)shape[i]) {
            char s[96];
            ad__fail(T, "%s: shape %s has too many elements", op, ad__dims_str(ndim, shape, s, sizeof s));
            return 0;
        }
        n *= (size_t)shape[i];
    }
    *size = n;
    return 1;
}

/* Fills in the header of a new tensor on T whose storage is data (NULL: none yet). */
AD__INLINE void ad__tensor_init(ad_tape *T, ad_tensor *t, int ndim, const int *shape, size_t size,
                                ad_real *data)
{
    int i;
    t->data = data;
    t->grad = NULL;
    t->size = size;
    t->ndim = ndim;
    for (i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->tape = T;
    t->node = NULL;
    t->next_leaf = NULL;
    t->id = T->ntensors++;
    t->gen = T->gen;
    t->requires_grad = 0;
    t->grad_is_external = 0;
}

/* A tensor's header is in the tape's header arena and its data on a 64-byte boundary in the
   main arena, except a one-element tensor's value, which follows its header directly: one
   value gains nothing from the boundary, and scalar tapes stay half the size. */
#define AD__ONE_HEADER_BYTES ((sizeof(ad_tensor) + 15) & ~(size_t)15)
#define AD__ONE_BYTES (AD__ONE_HEADER_BYTES + sizeof(ad_real))

/* A one-element tensor on T with a checked shape and an uninitialised value. */
AD__INLINE ad_tensor *ad__tensor_one(ad_tape *T, const char *op, int ndim, const int *shape)
{
    ad_tensor *t = (ad_tensor *)ad__alloc_head(T, AD__ONE_BYTES, op);
    if (t) ad__tensor_init(T, t, ndim, shape, 1, (ad_real *)((unsigned char *)t + AD__ONE_HEADER_BYTES));
    return t;
}

/* The block of a one-element op's result on a scalar tape: the tensor, its value, then its entry
   when it is recorded, so that recording the op allocates once. */
#define AD__ONE_ENTRY_OFFSET ((AD__ONE_BYTES + 15) & ~(size_t)15)
#define AD__ONE_BLOCK_BYTES(recorded) ((recorded) ? AD__ONE_ENTRY_OFFSET + sizeof(struct ad__node) : AD__ONE_BYTES)

AD__COLD unsigned char *ad__one_block_next_chunk(ad_tape *T, const char *op, int recorded)
{
    return (unsigned char *)ad__alloc_head(T, AD__ONE_BLOCK_BYTES(recorded), op);
}

/* Such a block, uninitialised; NULL (recorded on T) when memory runs out. */
AD__HOT unsigned char *ad__one_block(ad_tape *T, const char *op, int recorded)
{
    unsigned char *block = (unsigned char *)ad__arena_alloc_here(&T->heads, AD__ONE_BLOCK_BYTES(recorded), 16);
    return block ? block : ad__one_block_next_chunk(T, op, recorded);
}

/* A tensor on T with a checked shape of size elements and uninitialised data (or no data when
   with_data is 0). */
AD__INLINE ad_tensor *ad__tensor_sized(ad_tape *T, const char *op, int ndim, const int *shape, size_t size,
                                       int with_data)
{
    ad_tensor *t;
    ad_real *data = NULL;
    if (with_data && size == 1) return ad__tensor_one(T, op, ndim, shape);
    if (with_data && !(data = (ad_real *)ad__alloc(T, size * sizeof(ad_real), op))) return NULL;
    t = (ad_tensor *)ad__alloc_head(T, AD__ONE_HEADER_BYTES, op);
    if (t) ad__tensor_init(T, t, ndim, shape, size, data);
    return t;
}

/* The same for a shape given by the caller, which is checked first. */
AD__PRIVATE ad_tensor *ad__tensor(ad_tape *T, const char *op, int ndim, const int *shape, int with_data)
{
    size_t size = 1;
    if (ndim != 0 && !ad__check_shape(T, op, ndim, shape, &size)) return NULL;
    return ad__tensor_sized(T, op, ndim, shape, size, with_data);
}

/* A new tensor shaped like x. */
AD__INLINE ad_tensor *ad__like(ad_tape *T, const char *op, const ad_tensor *x)
{
    return ad__tensor_sized(T, op, x->ndim, x->shape, x->size, 1);
}

AD__PRIVATE void ad__make_leaf(ad_tape *T, ad_tensor *t, int requires_grad)
{
    if (requires_grad && !t->requires_grad) {
        t->next_leaf = T->leaves;
        T->leaves = t;
    }
    t->requires_grad = (unsigned char)(requires_grad != 0);
}

AUTODIFF_API ad_tensor *ad_tensor_new(ad_tape *T, int ndim, const int *shape, const ad_real *data,
                                      int requires_grad)
{
    ad_tensor *t;
    if (!T) return NULL;
    t = ad__tensor(T, "ad_tensor_new", ndim, shape, 1);
    if (!t) return NULL;
    if (data) memcpy(t->data, data, t->size * sizeof(ad_real));
    else memset(t->data, 0, t->size * sizeof(ad_real));
    ad__make_leaf(T, t, requires_grad);
    return t;
}

AUTODIFF_API ad_tensor *ad_tensor_view(ad_tape *T, int ndim, const int *shape, ad_real *data,
                                       ad_real *grad, int requires_grad)
{
    ad_tensor *t;
    if (!T) return NULL;
    if (!data) {
        ad__fail(T, "ad_tensor_view: data is NULL");
        return NULL;
    }
    t = ad__tensor(T, "ad_tensor_view", ndim, shape, 0);
    if (!t) return NULL;
    t->data = data;
    t->grad = grad;
    t->grad_is_external = grad != NULL;
    ad__make_leaf(T, t, requires_grad);
    return t;
}

/* A constant filled with value; errors name op, the function the caller called. */
AD__PRIVATE ad_tensor *ad__full(ad_tape *T, const char *op, int ndim, const int *shape, ad_real value)
{
    ad_tensor *t;
    size_t i;
    if (!T) return NULL;
    t = ad__tensor(T, op, ndim, shape, 1);
    if (!t) return NULL;
    for (i = 0; i < t->size; i++) t->data[i] = value;
    return t;
}

AUTODIFF_API ad_tensor *ad_full(ad_tape *T, int ndim, const int *shape, ad_real value)
{
    return ad__full(T, "ad_full", ndim, shape, value);
}
AUTODIFF_API ad_tensor *ad_zeros(ad_tape *T, int ndim, const int *shape) { return ad__full(T, "ad_zeros", ndim, shape, 0); }
AUTODIFF_API ad_tensor *ad_ones(ad_tape *T, int ndim, const int *shape) { return ad__full(T, "ad_ones", ndim, shape, 1); }

/* A one-element constant (ndim 0); errors name op. */
AD__PRIVATE ad_tensor *ad__scalar(ad_tape *T, const char *op, ad_real value)
{
    ad_tensor *t;
    if (!T) return NULL;
    t = ad__tensor_one(T, op, 0, NULL);
    if (t) t->data[0] = value;
    return t;
}

AUTODIFF_API ad_tensor *ad_scalar(ad_tape *T, ad_real value) { return ad__scalar(T, "ad_scalar", value); }

AUTODIFF_API ad_tensor *ad_var(ad_tape *T, ad_real value)
{
    ad_tensor *t = ad__scalar(T, "ad_var", value);
    if (t) ad__make_leaf(T, t, 1);
    return t;
}

AUTODIFF_API ad_tensor *ad_rand(ad_tape *T, int ndim, const int *shape, ad_real lo, ad_real hi,
                                ad_rng *rng)
{
    ad_tensor *t;
    size_t i;
    if (!T) return NULL;
    if (!rng) { ad__fail(T, "ad_rand: rng is NULL"); return NULL; }
    t = ad__tensor(T, "ad_rand", ndim, shape, 1);
    if (!t) return NULL;
    for (i = 0; i < t->size; i++) t->data[i] = (ad_real)(lo + (hi - lo) * ad_rng_uniform(rng));
    return t;
}

AUTODIFF_API ad_tensor *ad_randn(ad_tape *T, int ndim, const int *shape, ad_real mean, ad_real std,
                                 ad_rng *rng)
{
    ad_tensor *t;
    size_t i;
    if (!T) return NULL;
    if (!rng) { ad__fail(T, "ad_randn: rng is NULL"); return NULL; }
    t = ad__tensor(T, "ad_randn", ndim, shape, 1);
    if (!t) return NULL;
    for (i = 0; i < t->size; i++) t->data[i] = (ad_real)(mean + std * ad_rng_normal(rng));
    return t;
}

AUTODIFF_API void ad_set_requires_grad(ad_tensor *x, int requires_grad)
{
    if (!x || x->node) return; /* only leaves */
    ad__make_leaf(x->tape, x, requires_grad);
}

/* Whether x, given to op, has one element; records an error on x's tape when it has more. */
AD__PRIVATE int ad__item_ok(const ad_tensor *x, const char *op, const char *field)
{
    char s[96];
    if (x->size == 1) return 1;
    ad__fail(x->tape, "%s: x has shape %s; it must have exactly one element (read x->%s for more)", op,
             ad_shape_str(x, s, sizeof s), field);
    return 0;
}

AUTODIFF_API ad_real ad_item(const ad_tensor *x)
{
    return x && ad__item_ok(x, "ad_item", "data") && x->data ? x->data[0] : 0;
}
AUTODIFF_API ad_real ad_grad_item(const ad_tensor *x)
{
    return x && ad__item_ok(x, "ad_grad_item", "grad") && x->grad ? x->grad[0] : 0;
}

/* >>impl:rng --------------------------------------------------------------------------------- */
AD__PRIVATE uint64_t ad__splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

AUTODIFF_API void ad_rng_seed(ad_rng *rng, uint64_t seed)
{
    int i;
    if (!rng) return;
    for (i = 0; i < 4; i++) rng->s[i] = ad__splitmix64(&seed);
}

AUTODIFF_API uint64_t ad_rng_next(ad_rng *rng)
{
    uint64_t *s = rng->s, result, t;
    result = s[1] * 5;
    result = ((result << 7) | (result >> 57)) * 9;
    t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

AUTODIFF_API uint64_t ad_rng_below(ad_rng *rng, uint64_t n)
{
    uint64_t limit, x;
    if (n == 0) return 0;
    limit = (uint64_t)0 - ((uint64_t)0 - n) % n; /* largest multiple of n that fits, mod 2^64 */
    do x = ad_rng_next(rng); while (limit != 0 && x >= limit);
    return x % n;
}

AUTODIFF_API double ad_rng_uniform(ad_rng *rng)
{
    return (double)(ad_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

AUTODIFF_API double ad_rng_normal(ad_rng *rng)
{
    double u1 = 1.0 - ad_rng_uniform(rng); /* (0, 1]: log is finite */
    double u2 = ad_rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* >>impl:sweep ------------------------------------------------------------------------------- */
struct ad__sweep {
    ad_tape *T;
    ad_tensor **gacc;            /* gradient accumulated so far, by tensor id (NULL: none yet,
                                    unless owned[id] is AD__GRAD_VALUE) */
    ad_real *value;              /* by tensor id, -0 at the start: the gradient of a one-element
                                    tensor whose owned[id] is AD__GRAD_VALUE */
    unsigned char *owned;        /* 1 when gacc[id] is a buffer nobody else reads; AD__GRAD_UNIFORM
                                    when it is one value, the gradient of every element;
                                    AD__GRAD_VALUE when the gradient is value[id] */
    unsigned n;                  /* tensors that existed when the sweep began */
    int create_graph;
    int uniform_ok;              /* 1 when gradients may be held as one value (plain sweeps: no
                                    recording, hooks or anomaly checks); see ad__sum_backward */
    int take_over;               /* 1 when an elementwise op's input may take its output's
                                    gradient buffer over (ad__grad_take_over) */
    int failed;
    struct ad__watch *watch;     /* hooks and anomaly checks of this sweep, or NULL */
};

/* States of S->owned[id] for a gradient held as one value.
   AD__GRAD_UNIFORM: gacc[id] holds one value, the gradient of each element of tensor id (the
   gradient of a sum, say), which the entry producing the tensor reads as it is where it can
   (reads_held: ad__unary_backward, ad__binary_backward on operands of one shape) instead of a
   buffer full of the same value, and passes on as one value where its input's gradient is that
   value (a sum of two tensors, a shift).
   AD__GRAD_VALUE, for a tensor of one element: its gradient is S->value[id] and gacc[id] is
   NULL, so a scalar tape's sweep makes no tensor for a gradient; read as it is by the
   one-element ops' backward (reads_held). In a plain sweep every one-element tensor's gradient
   is held so until the entry that made the tensor reads it (leaves' to the end): contributions
   are added into value[id], which starts at -0 (ad__fill_negative_zero), and owned[id] says
   that one arrived.
   Both only in plain sweeps (uniform_ok); for any other reader the sweep makes the gradient a
   tensor first (ad__grad_spread). */
enum { AD__GRAD_UNIFORM = 2, AD__GRAD_VALUE = 3 };

/* Makes n, memory for an entry, the tape's last entry: out, produced by fn from nin inputs
   that the caller fills in (into n->in, which holds 3; a caller with more points it elsewhere). */
AD__INLINE void ad__link_entry(ad_tape *T, ad__node *n, ad_tensor *out, ad__backward_fn fn, int nin)
{
    n->saved = NULL;
    n->in = n->in_inline;
    n->nin = nin;
    n->reads_held = 0;
    n->backward = fn;
    n->out = out;
    n->prev = T->last;
    T->last = n;
    T->nentries++;
    out->node = n;
    out->requires_grad = 1;
}

/* Appends an entry for out, produced by fn from nin inputs that the caller fills in. NULL when
   memory runs out. */
AD__PRIVATE ad__node *ad__push_entry(ad_tape *T, const char *op, ad_tensor *out, ad__backward_fn fn, int nin)
{
    ad__node *n = (ad__node *)ad__arena_alloc(&T->arena, sizeof(ad__node), 16);
    ad_tensor **in = NULL;
    if (!n) {
        ad__fail(T, "%s: out of memory recording the operation", op);
        return NULL;
    }
    if (nin > 3) {
        in = (ad_tensor **)ad__alloc(T, (size_t)nin * sizeof(ad_tensor *), op);
        if (!in) return NULL;
    }
    ad__link_entry(T, n, out, fn, nin);
    n->op = op;
    if (in) n->in = in;
    return n;
}

AD__COLD ad__node *ad__anomaly_forward(ad_tape *T, const char *op, ad_tensor *out, ad_tensor *const *ins, int nin,
                                       ad__node *n); /* >>impl:hooks */

/* Whether an op with these inputs (NULL ones allowed) is recorded: gradients are on and one of
   them wants a gradient. An op that keeps state only for its backward asks first. */
AD__INLINE int ad__would_record(const ad_tape *T, ad_tensor *const *ins, int nin)
{
    int i;
    if (!T->grad_enabled) return 0;
    for (i = 0; i < nin; i++)
        if (ins[i] && ins[i]->requires_grad) return 1;
    return 0;
}

/* Records out as produced by fn from the inputs if any of them requires grad and recording is
   on. Returns the entry to save values into (a scratch entry when nothing is recorded), or NULL
   when memory runs out, or when anomaly mode finds a NaN or an Inf that out is the first to have. */
AD__INLINE ad__node *ad__record(ad_tape *T, const char *op, ad_tensor *out, ad__backward_fn fn,
                                ad_tensor *const *ins, int nin)
{
    ad__node *n;
    int i;
    if (!ad__would_record(T, ins, nin))
        return T->anomaly ? ad__anomaly_forward(T, op, out, ins, nin, &T->sink) : &T->sink;
    n = ad__push_entry(T, op, out, fn, nin);
    if (!n) return NULL;
    for (i = 0; i < nin; i++) n->in[i] = ins[i];
    return T->anomaly ? ad__anomaly_forward(T, op, out, ins, nin, n) : n;
}

AD__INLINE ad__node *ad__record1(ad_tape *T, const char *op, ad_tensor *out, ad__backward_fn fn,
                                 ad_tensor *a)
{
    return ad__record(T, op, out, fn, &a, 1);
}

AD__INLINE ad__node *ad__record2(ad_tape *T, const char *op, ad_tensor *out, ad__backward_fn fn,
                                 ad_tensor *a, ad_tensor *b)
{
    ad_tensor *ins[2];
    ins[0] = a;
    ins[1] = b;
    return ad__record(T, op, out, fn, ins, 2);
}

/* Does the sweep need a gradient for x? */
AD__PRIVATE int ad__wants(const ad__sweep *S, const ad_tensor *x)
{
    return x->requires_grad && x->id < S->n;
}

AD__PRIVATE int ad__same_shape(const ad_tensor *a, const ad_tensor *b)
{
    int i;
    if (a->ndim != b->ndim) return 0;
    for (i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

AD__PRIVATE void ad__add_into(ad_real *AD__RESTRICT y, const ad_real *AD__RESTRICT x, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) y[i] += x[i];
}

/* y[0..n) += x[0..n) (add set) or y = x, on the tape's threads from AD__SPLIT_LIGHT values: the
   gradients a backward sweep adds up or copies where two routes meet, which would otherwise
   leave the other threads waiting. */
typedef struct ad__move_job {
    ad_real *y;
    const ad_real *x;
    int add;
} ad__move_job;

AD__PRIVATE void ad__move_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__move_job *j = (const ad__move_job *)ctx;
    if (j->add) ad__add_into(j->y + lo, j->x + lo, hi - lo);
    else memcpy(j->y + lo, j->x + lo, (hi - lo) * sizeof(ad_real));
}

AD__PRIVATE void ad__move_split(ad_tape *T, ad_real *y, const ad_real *x, size_t n, int add)
{
    ad__move_job job;
    job.y = y;
    job.x = x;
    job.add = add;
    ad__parallel_range(T, ad__move_range, &job, n, AD__SPLIT_LIGHT, AD__STORE_BLOCK);
}

/* A new gradient buffer for x, owned by the sweep: a copy of held, x's gradient so far that is
   shared with another tensor, or uninitialised when held is NULL. NULL when memory runs out. */
AD__PRIVATE ad_real *ad__grad_buffer(ad__sweep *S, ad_tensor *x, const ad_tensor *held)
{
    ad_tensor *buf = ad__like(S->T, "ad_backward", x);
    if (!buf) { S->failed = 1; return NULL; }
    if (held) ad__move_split(S->T, buf->data, held->data, x->size, 0);
    S->gacc[x->id] = buf;
    S->owned[x->id] = 1;
    return buf->data;
}

/* Makes x's gradient, held as one value (AD__GRAD_UNIFORM, AD__GRAD_VALUE), a buffer of x's
   shape filled with it. Returns the buffer, or NULL when memory runs out. */
AD__COLD ad_tensor *ad__grad_spread(ad__sweep *S, ad_tensor *x)
{
    ad_real v = S->owned[x->id] == AD__GRAD_VALUE ? S->value[x->id] : S->gacc[x->id]->data[0];
    ad_tensor *buf = ad__full(S->T, "ad_backward", x->ndim, x->shape, v);
    if (!buf) {
        S->failed = 1;
        return NULL;
    }
    S->gacc[x->id] = buf;
    S->owned[x->id] = 1;
    return buf;
}

/* Whether the backward of n, an elementwise op, may compute the gradient of its input x over
   gt, its output's gradient, in place, rather than into a new buffer; if so x takes gt over and
   1 is returned. A buffer just written is still in cache, where a new one comes from memory
   (the step of bench/cnn.c ran 1.03x faster with ReLU's backward so).
   Only in ad_backward's plain sweep, which reads no gradient of a tensor made by an op once the
   entry that made it has run (ad_grad returns such gradients; hooks read them), and only when gt
   is the sweep's own buffer, which nobody else reads, of x's shape, and x has no gradient yet
   (one element is held as a value). */
AD__PRIVATE int ad__grad_take_over(ad__sweep *S, const ad__node *n, ad_tensor *gt, ad_tensor *x)
{
    if (!S->take_over || S->owned[n->out->id] != 1 || x->size <= 1 || !ad__wants(S, x)) return 0;
    if (S->gacc[x->id] || S->owned[x->id] || !ad__same_shape(gt, x)) return 0;
    S->gacc[x->id] = gt;
    S->owned[x->id] = 1;
    S->owned[n->out->id] = 0;
    return 1;
}

/* Gives x the gradient value in every element, held as that one value (AD__GRAD_UNIFORM), where
   a plain sweep allows it: x has more than one element, was made by an entry (which reads the
   value or spreads it) and has no gradient yet. Returns 1 when x's gradient is taken care of
   (also when nobody wants it), 0 when the caller must accumulate a full tensor. */
AD__PRIVATE int ad__grad_uniform(ad__sweep *S, ad_tensor *x, ad_real value)
{
    ad_tensor *u;
    if (!ad__wants(S, x)) return 1;
    if (!S->uniform_ok || x->size <= 1 || !x->node || S->gacc[x->id]) return 0;
    u = ad__full(S->T, "ad_backward", 0, NULL, value);
    if (!u) {
        S->failed = 1;
        return 1;
    }
    S->gacc[x->id] = u;
    S->owned[x->id] = AD__GRAD_UNIFORM;
    return 1;
}

/* A fused backward kernel over the values [lo, hi) of its job, reading the incoming gradient
   from g (g[0] belongs to the value at lo). */
typedef void (*ad__grad_run_fn)(const void *job, size_t lo, size_t hi, const ad_real *g);

/* Runs run over [lo, hi): at once where g holds a value for each element (period 0), else in
   runs of at most period elements that each read g from its start, where g repeats one value
   (a gradient held as one value, AD__GRAD_UNIFORM, copied period times). */
AD__INLINE void ad__grad_runs(ad__grad_run_fn run, const void *job, size_t lo, size_t hi, const ad_real *g,
                              size_t period)
{
    size_t at, len;
    if (!period) {
        run(job, lo, hi, g + lo);
        return;
    }
    for (at = lo; at < hi; at += len) {
        len = hi - at < period ? hi - at : period;
        run(job, at, at + len, g);
    }
}

/* Where a fused backward kernel reads the gradient gt of n's output: gt's values (*g_period 0),
   or where the sweep holds it as one value (AD__GRAD_UNIFORM), period copies of it in run, a
   short run that stays in cache, read again from its start (*g_period = period). */
AD__INLINE const ad_real *ad__grad_source(const ad__sweep *S, const ad__node *n, const ad_tensor *gt, ad_real *run,
                                          size_t period, size_t *g_period)
{
    size_t i;
    *g_period = 0;
    if (S->owned[n->out->id] != AD__GRAD_UNIFORM) return gt->data;
    for (i = 0; i < period; i++) run[i] = gt->data[0];
    *g_period = period;
    return run;
}

/* Where a fused backward kernel writes x's gradient directly: the buffer that holds x's
   gradient so far, with *add set (add into it), or a new buffer, with *add clear (assign).
   Only for sweeps that do not record (create_graph off). NULL when memory runs out. */
AD__INLINE ad_real *ad__grad_target(ad__sweep *S, ad_tensor *x, int *add)
{
    ad_tensor *held;
    if (x->size == 1 && S->uniform_ok) { /* held as a value (AD__GRAD_VALUE), from -0 */
        S->owned[x->id] = AD__GRAD_VALUE;
        *add = 1;
        return &S->value[x->id];
    }
    if (S->owned[x->id] >= AD__GRAD_UNIFORM && !ad__grad_spread(S, x)) return NULL;
    held = S->gacc[x->id];
    *add = held != NULL;
    if (held && S->owned[x->id]) return held->data;
    return ad__grad_buffer(S, x, held);
}

/* A second or later contribution g to x's gradient: added with an op when the sweep records,
   else in place (into a copy when the gradient so far is shared). */
AD__PRIVATE void ad__accum_more(ad__sweep *S, ad_tensor *x, ad_tensor *g)
{
    ad_tensor **slot = &S->gacc[x->id];
    ad_real *d;
    int add;
    AUTODIFF_ASSERT(g->size == x->size);
    if (S->create_graph) {
        *slot = ad_add(S->T, *slot, g);
        if (!*slot) S->failed = 1;
    } else if ((d = ad__grad_target(S, x, &add)) != NULL) {
        ad__move_split(S->T, d, g->data, x->size, 1);
    }
}

/* Adds v to the gradient of x, a one-element tensor, for sweeps that do not record: held as a
   value where the sweep allows it (AD__GRAD_VALUE, see ad__grad_target), else in a buffer of
   the sweep's own. */
AD__INLINE void ad__accum_one(ad__sweep *S, ad_tensor *x, ad_real v)
{
    int add;
    ad_real *d = ad__grad_target(S, x, &add);
    if (d) d[0] = add ? d[0] + v : v;
}

/* Adds g (x's shape) into x's gradient. fresh says g is a new buffer that nothing else reads,
   so that a later contribution may be added into it in place. */
AD__INLINE void ad__accum(ad__sweep *S, ad_tensor *x, ad_tensor *g, int fresh)
{
    if (!g) { S->failed = 1; return; }
    if (!ad__wants(S, x)) return;
    AUTODIFF_ASSERT(g->size == x->size);
    if (x->size == 1 && S->uniform_ok) {
        ad__accum_one(S, x, g->data[0]);
        return;
    }
    if (S->gacc[x->id]) {
        ad__accum_more(S, x, g);
        return;
    }
    S->gacc[x->id] = g;
    S->owned[x->id] = (unsigned char)fresh;
}

/* Sums or broadcasts g to x's shape, then accumulates it. */
AD__PRIVATE void ad__accum_to(ad__sweep *S, ad_tensor *x, ad_tensor *g, int fresh)
{
    if (!g) { S->failed = 1; return; }
    if (!ad__wants(S, x)) return;
    if (ad__same_shape(g, x)) ad__accum(S, x, g, fresh);
    else if (g->size == x->size) ad__accum(S, x, ad_reshape(S->T, g, x->ndim, x->shape), 0);
    else if (g->size > x->size) ad__accum(S, x, ad_sum_to(S->T, g, x->ndim, x->shape), 1);
    else ad__accum(S, x, ad_broadcast_to(S->T, g, x->ndim, x->shape), 1);
}

/* Makes the gradient buffers that leaves already have the accumulators of the sweep, so that
   contributions are added into them in place (ad_backward's += semantics without a temporary
   and a final pass). y itself keeps the ordinary seed. */
AD__PRIVATE int ad__sweep_into_leaves(ad__sweep *S, const ad_tensor *y)
{
    ad_tensor *leaf, *view;
    for (leaf = S->T->leaves; leaf; leaf = leaf->next_leaf) {
        if (!leaf->grad || leaf == y || leaf->id >= S->n) continue;
        if (leaf->size == 1 && S->uniform_ok) continue; /* held as a value, added at the end */
        view = ad__tensor(S->T, "ad_backward", leaf->ndim, leaf->shape, 0);
        if (!view) return -1;
        view->data = leaf->grad;
        S->gacc[leaf->id] = view;
        S->owned[leaf->id] = 1;
    }
    return 0;
}

/* Whether a sweep must run its entries with hooks or anomaly checks around them (then through
   ad__sweep_watched, which does the whole sweep and returns NULL). */
AD__PRIVATE int ad__sweep_is_watched(const ad_tape *T, int into_leaves); /* >>impl:hooks */
AD__COLD ad__node *ad__sweep_watched(ad__sweep *S, int into_leaves, const char *op);
AD__COLD void ad__sweep_watched_end(ad__sweep *S);
AD__HOT void ad__binary_one_derivs(const ad__node *n, ad_real g_value, ad_real *da, ad_real *db);
AD__HOT ad_real ad__unary_one_deriv(const ad__node *n, ad_real g_value);

/* Adds v to the gradient of tensor id, held as a value (AD__GRAD_VALUE) in the tables value and
   owned of a plain sweep. */
AD__HOT void ad__held_add(ad_real *value, unsigned char *owned, unsigned id, ad_real v)
{
    value[id] += v;
    owned[id] = AD__GRAD_VALUE;
}

/* The sweep over one-element entries that read their output's gradient as a value (scalar
   tapes), from n back to the first entry that does not, which it returns (NULL: the tape's
   start). Only in plain sweeps (uniform_ok), where a one-element tensor's gradient is held in
   S->value until the entry that made it reads it. */
AD__HOT ad__node *ad__sweep_values(ad__sweep *S, ad__node *n)
{
    /* the tables in locals: to the compiler a store into owned might change S's fields */
    ad_real *value = S->value;
    unsigned char *owned = S->owned;
    for (; n && n->reads_held == AD__GRAD_VALUE; n = n->prev) {
        unsigned id = n->out->id;
        ad_tensor *a = n->in[0], *b;
        ad_real da, db;
        if (owned[id] != AD__GRAD_VALUE) continue; /* no gradient reached it */
        if (n->nin == 1) {
            if (a->requires_grad) ad__held_add(value, owned, a->id, ad__unary_one_deriv(n, value[id]));
            continue;
        }
        b = n->in[1];
        ad__binary_one_derivs(n, value[id], &da, &db);
        if (a->requires_grad) ad__held_add(value, owned, a->id, da);
        if (b->requires_grad) ad__held_add(value, owned, b->id, db);
    }
    return n;
}

/* x's gradient after a sweep, as a tensor of x's shape; NULL when x got none or when memory
   runs out (S->failed says which). */
AD__PRIVATE ad_tensor *ad__sweep_result(ad__sweep *S, ad_tensor *x)
{
    if (x->id >= S->n || !(S->gacc[x->id] || S->owned[x->id] == AD__GRAD_VALUE)) return NULL;
    if (S->owned[x->id] >= AD__GRAD_UNIFORM) return ad__grad_spread(S, x);
    return S->gacc[x->id];
}

/* Fills v[0, n) with -0, the exact identity of addition: -0 + x is x for every x, -0 included,
   so a gradient held as a value (AD__GRAD_VALUE) that one contribution reached is that
   contribution bit for bit, as a buffer's first contribution is. */
AD__PRIVATE void ad__fill_negative_zero(ad_real *v, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) v[i] = -(ad_real)0;
}

/* Runs the reverse sweep from y. On return S holds d y / d t for every tensor t that existed
   before the sweep and that y depends on, read through ad__sweep_result (added to the leaves'
   own gradient buffers when into_leaves is set). Returns 0 on success. */
AD__PRIVATE int ad__sweep_run(ad__sweep *S, ad_tape *T, ad_tensor *y, int create_graph, int into_leaves,
                              const char *op)
{
    ad__node *n;
    ad_tensor *seed;
    int saved_enabled = T->grad_enabled, watched;
    size_t value_bytes;
    char s[96];
    memset(S, 0, sizeof *S);
    S->T = T;
    if (!y) return -1;
    if (!ad__on_tape(T, op, "y", y)) return -1;
    if (y->size != 1) {
        ad__fail(T, "%s: y has shape %s; it must have exactly one element", op,
                 ad_shape_str(y, s, sizeof s));
        return -1;
    }
    S->n = T->ntensors;
    S->create_graph = create_graph;
    watched = ad__sweep_is_watched(T, into_leaves);
    S->uniform_ok = !create_graph && !watched;
    S->take_over = S->uniform_ok && into_leaves;
    /* one block for the three tables, each aligned for its type; gradients held as values are
       added from -0 (ad__fill_negative_zero) */
    value_bytes = ((size_t)S->n * sizeof(ad_real) + 15) & ~(size_t)15;
    S->value = (ad_real *)ad__alloc(T, value_bytes + (size_t)S->n * (sizeof(ad_tensor *) + 1), op);
    if (!S->value) return -1;
    S->gacc = (ad_tensor **)((unsigned char *)S->value + value_bytes);
    S->owned = (unsigned char *)(S->gacc + S->n);
    memset(S->gacc, 0, (size_t)S->n * (sizeof(ad_tensor *) + 1));
    ad__fill_negative_zero(S->value, S->n);
    if (!y->requires_grad) return 0;
    if (into_leaves && ad__sweep_into_leaves(S, y) != 0) return -1;
    if (S->uniform_ok) {
        S->value[y->id] = 1;
        S->owned[y->id] = AD__GRAD_VALUE;
    } else {
        if (!(seed = ad__like(T, op, y))) return -1;
        seed->data[0] = 1;
        S->gacc[y->id] = seed;
        S->owned[y->id] = 1; /* the seed is the sweep's own, like any other buffer it makes */
    }
    T->grad_enabled = create_graph != 0;
    /* every entry visited was recorded before the sweep began, so its tensors' ids are below n */
    n = watched ? ad__sweep_watched(S, into_leaves, op) : T->last;
    for (; n && !S->failed; n = n->prev) {
        unsigned id = n->out->id;
        unsigned char held = S->owned[id];
        ad_tensor *g = S->gacc[id];
        if (held == AD__GRAD_VALUE && n->reads_held == AD__GRAD_VALUE) { /* scalar tapes: no calls */
            if (!(n = ad__sweep_values(S, n))) break;
            id = n->out->id;
            held = S->owned[id];
            g = S->gacc[id];
        }
        if (held >= AD__GRAD_UNIFORM && held != n->reads_held && !(g = ad__grad_spread(S, n->out))) break;
        if (g) n->backward(S, n, g);
    }
    T->grad_enabled = saved_enabled;
    if (S->failed) {
        if (!T->has_error) ad__fail(T, "%s: the backward sweep failed", op);
        return -1;
    }
    return 0;
}

AUTODIFF_API int ad_backward(ad_tape *T, ad_tensor *y)
{
    ad__sweep S;
    ad_tensor *leaf;
    if (!T) return -1;
    if (!y) {
        ad__fail(T, "ad_backward: y is NULL (an earlier op failed)");
        return -1;
    }
    if (ad__sweep_run(&S, T, y, 0, 1, "ad_backward") != 0) return -1;
    for (leaf = T->leaves; leaf; leaf = leaf->next_leaf) {
        ad_tensor *g = leaf->id < S.n ? S.gacc[leaf->id] : NULL;
        if (!g && leaf->id < S.n && S.owned[leaf->id] == AD__GRAD_VALUE) {
            if (leaf->grad) leaf->grad[0] += S.value[leaf->id];
            else leaf->grad = &S.value[leaf->id]; /* the sweep's table lives until the reset */
            continue;
        }
        if (!g || g->data == leaf->grad) continue; /* none, or already added in place */
        if (leaf->grad) {
            ad__move_split(T, leaf->grad, g->data, leaf->size, 1);
        } else if (S.owned[leaf->id]) {
            leaf->grad = g->data; /* a buffer of this sweep that nothing else uses */
        } else {
            leaf->grad = (ad_real *)ad__alloc(T, leaf->size * sizeof(ad_real), "ad_backward");
            if (!leaf->grad) return -1;
            ad__move_split(T, leaf->grad, g->data, leaf->size, 0);
        }
    }
    if (S.watch) ad__sweep_watched_end(&S);
    return 0;
}

AUTODIFF_API ad_tensor *ad_grad(ad_tape *T, ad_tensor *y, ad_tensor *x, int create_graph)
{
    ad__sweep S;
    ad_tensor *g;
    if (!T) return NULL;
    if (!y || !x) {
        ad__fail(T, "ad_grad: %s is NULL (an earlier op failed)", y ? "x" : "y");
        return NULL;
    }
    if (!ad__on_tape(T, "ad_grad", "x", x)) return NULL;
    if (ad__sweep_run(&S, T, y, create_graph, 0, "ad_grad") != 0) return NULL;
    g = ad__sweep_result(&S, x);
    if (S.failed) return NULL;
    return g ? g : ad_zeros(T, x->ndim, x->shape);
}

/* >>impl:autograd: ad_grads and the helpers built on it -------------------------------------- */
/* Every helper is one or more ad_grads sweeps. ad_grads seeds the ordinary one-element sweep of
   ad__sweep_run with s = sum_i sum(grad_ys[i] * ys[i]), recorded: the sweep through that product
   hands each ys[i] its seed, and with create_graph the results stay differentiable in the seeds,
   which is what ad_jvp's double-backward trick and the forward-mode Jacobian differentiate. */

/* Whether t, the argument called what of op, is usable: not NULL and on T. */
AD__PRIVATE int ad__autograd_arg(ad_tape *T, const char *op, const char *what, const ad_tensor *t)
{
    if (!t) {
        ad__fail(T, "%s: %s is NULL (an earlier op failed)", op, what);
        return 0;
    }
    return ad__on_tape(T, op, what, t);
}

/* Whether seed (called sname; NULL: ones) may seed t (called tname): the same shape, or both one
   element. */
AD__PRIVATE int ad__autograd_seed(ad_tape *T, const char *op, const char *tname, const ad_tensor *t,
                                  const char *sname, const ad_tensor *seed)
{
    char a[96], b[96];
    if (!seed) {
        if (t->size == 1) return 1;
        ad__fail(T, "%s: %s has shape %s and %s is NULL; ones may be left out only for one element",
                 op, tname, ad_shape_str(t, a, sizeof a), sname);
        return 0;
    }
    if (!ad__on_tape(T, op, sname, seed)) return 0;
    if (ad__same_shape(seed, t) || (seed->size == 1 && t->size == 1)) return 1;
    ad__fail(T, "%s: %s has shape %s but %s has shape %s; they must be equal", op, sname,
             ad_shape_str(seed, a, sizeof a), tname, ad_shape_str(t, b, sizeof b));
    return 0;
}

/* ad_grads with its arguments checked; errors name op. */
AD__PRIVATE int ad__grads(ad_tape *T, const char *op, int ny, ad_tensor *const *ys, ad_tensor *const *seeds,
                          int nx, ad_tensor *const *xs, ad_tensor **out, int create_graph)
{
    ad__sweep S;
    ad_tensor *s = NULL;
    int i, enabled = T->grad_enabled;
    T->grad_enabled = 1; /* s must be recorded, in no-grad mode too */
    for (i = 0; i < ny; i++) {
        ad_tensor *term = ys[i], *seed = seeds ? seeds[i] : NULL;
        if (seed) term = ad_sum(T, ad_mul(T, seed, ys[i]));
        s = s ? ad_add(T, s, term) : term;
    }
    T->grad_enabled = enabled;
    if (!s) return -1;
    if (ad__sweep_run(&S, T, s, create_graph, 0, op) != 0) return -1;
    for (i = 0; i < nx; i++) {
        ad_tensor *g = ad__sweep_result(&S, xs[i]);
        if (S.failed) return -1;
        out[i] = g ? g : ad__full(T, op, xs[i]->ndim, xs[i]->shape, 0);
        if (!out[i]) return -1;
    }
    return 0;
}

AUTODIFF_API int ad_grads(ad_tape *T, int ny, ad_tensor *const *ys, ad_tensor *const *grad_ys,
                          int nx, ad_tensor *const *xs, ad_tensor **out, int create_graph)
{
    char what[48], seed[48];
    int i, ok = 1;
    if (!T) return -1;
    if (!out) {
        ad__fail(T, "ad_grads: out is NULL");
        return -1;
    }
    for (i = 0; i < nx; i++) out[i] = NULL;
    if (ny < 1 || nx < 1 || !ys || !xs) {
        ad__fail(T, "ad_grads: %d outputs (ys %s) and %d inputs (xs %s); each needs at least one", ny,
                 ys ? "given" : "NULL", nx, xs ? "given" : "NULL");
        return -1;
    }
    for (i = 0; ok && i < ny; i++) {
        snprintf(what, sizeof what, "ys[%d]", i);
        snprintf(seed, sizeof seed, "grad_ys[%d]", i);
        ok = ad__autograd_arg(T, "ad_grads", what, ys[i]) &&
             ad__autograd_seed(T, "ad_grads", what, ys[i], seed, grad_ys ? grad_ys[i] : NULL);
    }
    for (i = 0; ok && i < nx; i++) {
        snprintf(what, sizeof what, "xs[%d]", i);
        ok = ad__autograd_arg(T, "ad_grads", what, xs[i]);
    }
    if (ok && ad__grads(T, "ad_grads", ny, ys, grad_ys, nx, xs, out, create_graph) == 0) return 0;
    for (i = 0; i < nx; i++) out[i] = NULL;
    return -1;
}

AUTODIFF_API ad_tensor *ad_vjp(ad_tape *T, ad_tensor *y, ad_tensor *x, ad_tensor *v, int create_graph)
{
    ad_tensor *g;
    if (!T) return NULL;
    if (!ad__autograd_arg(T, "ad_vjp", "y", y) || !ad__autograd_arg(T, "ad_vjp", "x", x) ||
        !ad__autograd_seed(T, "ad_vjp", "y", y, "v", v))
        return NULL;
    return ad__grads(T, "ad_vjp", 1, &y, &v, 1, &x, &g, create_graph) == 0 ? g : NULL;
}

/* J u for checked arguments (u NULL: ones): d/dw <w^T J, u> for a dummy w that requires grad,
   whose value does not matter because w^T J is linear in w. */
AD__PRIVATE ad_tensor *ad__jvp(ad_tape *T, const char *op, ad_tensor *y, ad_tensor *x, ad_tensor *u,
                               int create_graph)
{
    ad_tensor *w, *g, *ju;
    if (!y->requires_grad || !x->requires_grad) return ad__full(T, op, y->ndim, y->shape, 0);
    w = ad__full(T, op, y->ndim, y->shape, 0);
    if (!w) return NULL;
    ad__make_leaf(T, w, 1);
    if (ad__grads(T, op, 1, &y, &w, 1, &x, &g, 1) != 0) return NULL;
    if (ad__grads(T, op, 1, &g, &u, 1, &w, &ju, create_graph) != 0) return NULL;
    return ju;
}

AUTODIFF_API ad_tensor *ad_jvp(ad_tape *T, ad_tensor *y, ad_tensor *x, ad_tensor *u, int create_graph)
{
    if (!T) return NULL;
    if (!ad__autograd_arg(T, "ad_jvp", "y", y) || !ad__autograd_arg(T, "ad_jvp", "x", x) ||
        !ad__autograd_seed(T, "ad_jvp", "x", x, "u", u))
        return NULL;
    return ad__jvp(T, "ad_jvp", y, x, u, create_graph);
}

/* d y / d x shaped lead ++ x.shape (lead: nlead dimensions, y->size elements in all), for
   checked arguments; errors name op. m = y->size rows, n = x->size columns: m sweeps seeded by
   the rows of the identity when m <= n, else the recorded g(w) = w^T J of ad__jvp and n sweeps
   through it seeded by its columns. Without create_graph the rows or columns are copied into
   place; with it they are stacked by recorded ops. */
AD__PRIVATE ad_tensor *ad__jacobian(ad_tape *T, const char *op, ad_tensor *y, int nlead, const int *lead,
                                    ad_tensor *x, int create_graph)
{
    int shape[AD_MAX_DIMS], flat[2], i, enabled, rows, count;
    size_t m = y->size, n = x->size, k, j;
    ad_tensor *J = NULL, *w = NULL, *g = NULL, *src, *e, **parts = NULL;
    char a[96], b[96];
    if (nlead + x->ndim > AD_MAX_DIMS) {
        ad__fail(T, "%s: y %s and x %s: the result would have %d dimensions; at most %d are supported "
                 "(AD_MAX_DIMS)", op, ad_shape_str(y, a, sizeof a), ad_shape_str(x, b, sizeof b),
                 nlead + x->ndim, AD_MAX_DIMS);
        return NULL;
    }
    if (m > (size_t)INT_MAX || n > (size_t)INT_MAX || (n > 0 && m > ((size_t)-1 / sizeof(ad_real)) / n)) {
        ad__fail(T, "%s: y %s and x %s: the result would be too large", op, ad_shape_str(y, a, sizeof a),
                 ad_shape_str(x, b, sizeof b));
        return NULL;
    }
    for (i = 0; i < nlead; i++) shape[i] = lead[i];
    for (i = 0; i < x->ndim; i++) shape[nlead + i] = x->shape[i];
    if (!y->requires_grad || !x->requires_grad) return ad__full(T, op, nlead + x->ndim, shape, 0);
    rows = m <= n;
    src = rows ? y : NULL;
    if (!rows) { /* forward mode: g = w^T J, recorded once */
        w = ad__full(T, op, y->ndim, y->shape, 0);
        if (!w) return NULL;
        ad__make_leaf(T, w, 1);
        if (ad__grads(T, op, 1, &y, &w, 1, &x, &g, 1) != 0) return NULL;
        src = g;
    }
    count = (int)(rows ? m : n);
    if (create_graph) {
        parts = (ad_tensor **)ad__alloc(T, (size_t)count * sizeof(ad_tensor *), op);
        if (!parts) return NULL;
    } else {
        J = ad__tensor(T, op, nlead + x->ndim, shape, 1);
        if (!J) return NULL;
    }
    e = ad__full(T, op, src->ndim, src->shape, 0); /* the seed: one row of the identity */
    if (!e) return NULL;
    for (k = 0; k < (size_t)count; k++) {
        ad_tensor *part;
        e->data[k] = 1;
        if (ad__grads(T, op, 1, &src, &e, 1, rows ? &x : &w, &part, create_graph) != 0) return NULL;
        if (create_graph) {
            /* the recorded result reads e when it is differentiated: the next seed is a new one */
            parts[k] = part;
            if (k + 1 < (size_t)count && !(e = ad__full(T, op, src->ndim, src->shape, 0))) return NULL;
            continue;
        }
        if (rows) memcpy(J->data + k * n, part->data, n * sizeof(ad_real));
        else for (j = 0; j < m; j++) J->data[j * n + k] = part->data[j];
        e->data[k] = 0; /* a plain sweep is done with e once its result is copied */
    }
    if (!create_graph) return J;
    enabled = T->grad_enabled;
    T->grad_enabled = 1;
    flat[0] = (int)(rows ? n : m);
    for (k = 0; k < (size_t)count; k++) parts[k] = ad_reshape(T, parts[k], 1, flat);
    J = ad_stack(T, parts, count, rows ? 0 : 1);
    J = ad_reshape(T, J, nlead + x->ndim, shape);
    T->grad_enabled = enabled;
    return J;
}

AUTODIFF_API ad_tensor *ad_jacobian(ad_tape *T, ad_tensor *y, ad_tensor *x, int create_graph)
{
    if (!T) return NULL;
    if (!ad__autograd_arg(T, "ad_jacobian", "y", y) || !ad__autograd_arg(T, "ad_jacobian", "x", x)) return NULL;
    return ad__jacobian(T, "ad_jacobian", y, y->size == 1 ? 0 : y->ndim, y->shape, x, create_graph);
}

AUTODIFF_API ad_tensor *ad_hessian(ad_tape *T, ad_tensor *y, ad_tensor *x, int create_graph)
{
    ad_tensor *g;
    char a[96], b[96];
    if (!T) return NULL;
    if (!ad__autograd_arg(T, "ad_hessian", "y", y) || !ad__autograd_arg(T, "ad_hessian", "x", x)) return NULL;
    if (y->size != 1) {
        ad__fail(T, "ad_hessian: y has shape %s; it must have exactly one element", ad_shape_str(y, a, sizeof a));
        return NULL;
    }
    if (2 * x->ndim > AD_MAX_DIMS) {
        ad__fail(T, "ad_hessian: x %s: the Hessian would have %d dimensions; at most %d are supported "
                 "(AD_MAX_DIMS)", ad_shape_str(x, b, sizeof b), 2 * x->ndim, AD_MAX_DIMS);
        return NULL;
    }
    if (ad__grads(T, "ad_hessian", 1, &y, NULL, 1, &x, &g, 1) != 0) return NULL;
    return ad__jacobian(T, "ad_hessian", g, x->ndim, x->shape, x, create_graph);
}

AUTODIFF_API ad_tensor *ad_detach(ad_tape *T, ad_tensor *x)
{
    ad_tensor *t;
    if (!T) return NULL;
    if (!ad__autograd_arg(T, "ad_detach", "x", x)) return NULL;
    t = ad__tensor_sized(T, "ad_detach", x->ndim, x->shape, x->size, 0);
    if (t) t->data = x->data;
    return t;
}

/* >>impl:kernels ----------------------------------------------------------------------------- */

/* How two operands are read while walking an output of a broadcast shape: per dimension the
   output extent and each operand's stride (0 where the operand is broadcast). Adjacent dimensions
   that are contiguous in every operand are merged, so the innermost loop is as long as possible. */
typedef struct ad__walk {
    int ndim;
    size_t shape[AD_MAX_DIMS];
    size_t sa[AD_MAX_DIMS], sb[AD_MAX_DIMS];
    size_t total;
} ad__walk;

/* Strides of x aligned at the right against an output with ndim dimensions. */
AD__PRIVATE void ad__bcast_strides(const int *shape, int ndim, int out_ndim, size_t *stride)
{
    size_t s = 1;
    int i, j;
    for (i = out_ndim - 1, j = ndim - 1; i >= 0; i--, j--) {
        if (j < 0 || shape[j] == 1) {
            stride[i] = 0;
        } else {
            stride[i] = s;
            s *= (size_t)shape[j];
        }
    }
}

AD__PRIVATE void ad__walk_init(ad__walk *w, int ndim, const int *out_shape, const ad_tensor *a,
                               const ad_tensor *b)
{
    size_t sa[AD_MAX_DIMS], sb[AD_MAX_DIMS];
    int i, k;
    if (ndim == 0) {
        w->ndim = 1;
        w->shape[0] = 1;
        w->sa[0] = w->sb[0] = 0;
        w->total = 1;
        return;
    }
    ad__bcast_strides(a->shape, a->ndim, ndim, sa);
    if (b) ad__bcast_strides(b->shape, b->ndim, ndim, sb);
    else memset(sb, 0, sizeof sb);
    w->total = 1;
    k = -1;
    for (i = 0; i < ndim; i++) {
        size_t n = (size_t)out_shape[i];
        w->total *= n;
        if (n == 1) continue; /* contributes nothing to any offset */
        if (k >= 0 && w->sa[k] == sa[i] * n && w->sb[k] == sb[i] * n) {
            w->shape[k] *= n; /* contiguous with the previous kept dimension in both */
            w->sa[k] = sa[i];
            w->sb[k] = sb[i];
        } else {
            k++;
            w->shape[k] = n;
            w->sa[k] = sa[i];
            w->sb[k] = sb[i];
        }
    }
    if (k < 0) {
        k = 0;
        w->shape[0] = 1;
        w->sa[0] = w->sb[0] = 0;
    }
    w->ndim = k + 1;
}

/* Advances the outer index (all but the last dimension) and the operand offsets. */
AD__PRIVATE void ad__walk_next(const ad__walk *w, size_t *idx, size_t *oa, size_t *ob)
{
    int d;
    for (d = w->ndim - 2; d >= 0; d--) {
        idx[d]++;
        *oa += w->sa[d];
        *ob += w->sb[d];
        if (idx[d] < w->shape[d]) return;
        *oa -= w->sa[d] * w->shape[d];
        *ob -= w->sb[d] * w->shape[d];
        idx[d] = 0;
    }
}

/* y (output shape) = x broadcast: walk over y's shape reading x with stride sa. */
AD__PRIVATE void ad__broadcast_kernel(const ad__walk *w, const ad_real *AD__RESTRICT x,
                                      ad_real *AD__RESTRICT y)
{
    size_t idx[AD_MAX_DIMS] = {0}, oa = 0, ob = 0, o, i;
    size_t inner = w->shape[w->ndim - 1], outer = w->total / inner;
    size_t ia = w->sa[w->ndim - 1];
    for (o = 0; o < outer; o++) {
        ad_real *row = y + o * inner;
        if (ia) memcpy(row, x + oa, inner * sizeof(ad_real));
        else for (i = 0; i < inner; i++) row[i] = x[oa];
        ad__walk_next(w, idx, &oa, &ob);
    }
}

/* y (small shape) += x summed over the broadcast dimensions: walk over x's shape with y's
   strides in sa. */
AD__PRIVATE void ad__sum_to_kernel(const ad__walk *w, const ad_real *AD__RESTRICT x,
                                   ad_real *AD__RESTRICT y)
{
    size_t idx[AD_MAX_DIMS] = {0}, oa = 0, ob = 0, o, i;
    size_t inner = w->shape[w->ndim - 1], outer = w->total / inner;
    size_t ia = w->sa[w->ndim - 1];
    for (o = 0; o < outer; o++) {
        const ad_real *row = x + o * inner;
        if (ia) {
            ad__add_into(y + oa, row, inner);
        } else {
            ad_real s = 0;
            for (i = 0; i < inner; i++) s += row[i];
            y[oa] += s;
        }
        ad__walk_next(w, idx, &oa, &ob);
    }
}

/* The sum of x[0..n-1]: eight partial sums and a tail, combined in a fixed order, which is
   vectorisable and reproducible. */
AD__INLINE ad_real ad__sum_run(const ad_real *AD__RESTRICT x, size_t n)
{
    ad_real part[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0;
    size_t j, i;
    for (j = 0; j + 8 <= n; j += 8)
        for (i = 0; i < 8; i++) part[i] += x[j + i];
    for (; j < n; j++) s += x[j];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])) + s;
}

/* Reductions over the middle axis of x viewed as [outer, n, inner]. */
AD__PRIVATE void ad__reduce_sum(const ad_real *AD__RESTRICT x, ad_real *AD__RESTRICT y, size_t outer,
                                size_t n, size_t inner, ad_real scale)
{
    size_t o, j, i;
    for (o = 0; o < outer; o++) {
        const ad_real *src = x + o * n * inner;
        ad_real *dst = y + o * inner;
        if (inner == 1) {
            dst[0] = ad__sum_run(src, n) * scale;
        } else {
            memcpy(dst, src, inner * sizeof(ad_real));
            for (j = 1; j < n; j++) ad__add_into(dst, src + j * inner, inner);
            if (scale != 1)
                for (i = 0; i < inner; i++) dst[i] *= scale;
        }
    }
}

/* Short loops written in blocks of eight, which compilers vectorise even at -O2. */
AD__PRIVATE void ad__nn_copy(ad_real *AD__RESTRICT y, const ad_real *AD__RESTRICT x, size_t n)
{
    size_t i = 0, j;
    for (; i + 8 <= n; i += 8)
        for (j = 0; j < 8; j++) y[i + j] = x[i + j];
    for (; i < n; i++) y[i] = x[i];
}

AD__PRIVATE void ad__nn_add(ad_real *AD__RESTRICT y, const ad_real *AD__RESTRICT x, size_t n)
{
    size_t i = 0, j;
    for (; i + 8 <= n; i += 8)
        for (j = 0; j < 8; j++) y[i + j] += x[i + j];
    for (; i < n; i++) y[i] += x[i];
}

/* Splits a shape around axis into [outer, n, inner]. */
AD__PRIVATE void ad__split_axis(const ad_tensor *x, int axis, size_t *outer, size_t *n, size_t *inner)
{
    int i;
    *outer = *inner = 1;
    for (i = 0; i < axis; i++) *outer *= (size_t)x->shape[i];
    *n = (size_t)x->shape[axis];
    for (i = axis + 1; i < x->ndim; i++) *inner *= (size_t)x->shape[i];
}

/* >>impl:gemm -------------------------------------------------------------------------------- */
/* C = op(A) op(B) (+ C when accumulating), row-major, op() transposing on request. GotoBLAS
   layout: B is packed into panels of NR columns and A into panels of MR rows, blocked so that
   a KC x NC panel of B stays in L2/L3 and an MC x KC block of A in L1/L2; the micro-kernel keeps
   an MR x NR tile of C in registers. The micro-kernel is written with GCC/Clang vector
   extensions; on x86 a version for AVX-512 and one for AVX2 are compiled with target attributes
   and chosen at run time, so plain `cc -O2` gets the machine's widest vectors. */
#define AD__NR_MAX (64 / (int)sizeof(ad_real) * 2)

/* A core's L2 cache in bytes, from cpuid's leaf 0x80000006 (filled by Intel's processors and
   AMD's alike); 0 where it is not known. */
AD__PRIVATE size_t ad__l2_bytes(void)
{
#if AD__X86_DISPATCH
    unsigned a, b, c, d;
    if (__get_cpuid(0x80000006u, &a, &b, &c, &d)) return (size_t)(c >> 16) * 1024;
#endif
    return 0;
}

/* The longest K block for a core with l2 bytes of L2: an MC x KC block of A in at most half of it,
   a multiple of 16 values, at most AD__KC_MAX. Longer blocks pass over C fewer times: on Zen 4
   (1 MiB of L2) KC 512 made 1024^3 and 2048^3 products 2.5-3% faster than KC 256, and 768 or
   1024 no faster than 512; on Sapphire Rapids (2 MiB) KC 192 was 5% slower than 256 at 2048^3.
   Half of L2 leaves room for B's panels streaming through it. */
AD__PRIVATE int ad__gemm_kc_for_l2(size_t l2)
{
    size_t kc;
    if (!l2) return AD__KC_UNKNOWN_L2;
    kc = l2 / 2 / (AD__MC * sizeof(ad_real)) / 16 * 16;
    return kc > AD__KC_MAX ? AD__KC_MAX : kc < 64 ? 64 : (int)kc;
}

/* The longest K block of this machine's products, probed once (cpuid is slow in a virtual
   machine). Every product reads it, so all paths and thread counts block K alike. */
#if AD__X86_DISPATCH
static int ad__gemm_kc_probed;
#endif
AD__INLINE int ad__gemm_kc_limit(void)
{
#if AD__X86_DISPATCH
    int kc = __atomic_load_n(&ad__gemm_kc_probed, __ATOMIC_RELAXED);
    if (!kc) {
        kc = ad__gemm_kc_for_l2(ad__l2_bytes());
        __atomic_store_n(&ad__gemm_kc_probed, kc, __ATOMIC_RELAXED);
    }
    return kc;
#else
    return AD__KC_UNKNOWN_L2; /* no cpuid to ask */
#endif
}

/* The length of the K blocks of the product C (M x N) = op(A) op(B) with K inner values, B
   transposed or not (tb): as few as ad__gemm_kc_limit() allows, of equal length (the last may be
   shorter by the rounding), so that a product split along K over threads splits evenly. A
   product's block is chosen once, from the whole product, and every path blocks K with it: each
   element of C is C plus one partial sum per block, added block after block, whatever the path
   and the thread count.
   One exception: a product whose C is small enough to be split along K over threads
   (ad__gemm_splits_k), with B not transposed (a layer's weight), takes two blocks where K is
   longer than AD__KC_SMALL_C but fits one block of the limit. A 512-row weight is then two
   bands of rows, one a thread, as its gradient and its update are cut, where one block would
   leave it split into column stripes read by the other thread; an extra pass over a small C
   costs little. Products with B transposed keep one block, so that a B packed beforehand
   (ad__gemm_prepack_bt, which does not know M) serves every such product. */
AD__INLINE int ad__gemm_kstep(int M, int N, int K, int tb)
{
    int limit = ad__gemm_kc_limit(), blocks = (K + limit - 1) / limit;
    if (blocks == 1 && K > AD__KC_SMALL_C && !tb && (double)M * N <= AD__KSPLIT_MAX_C) blocks = 2;
    return blocks > 1 ? (K + blocks - 1) / blocks : K;
}

/* A micro-kernel reads element (i, k) of its A operand at A[i * a_row + k * a_k]: a packed panel
   (a_row 1, a_k MR), or op(A) in place. It stores the first rows x cols of its tile. */
typedef void (*ad__microkernel)(int kc, const ad_real *A, ptrdiff_t a_row, ptrdiff_t a_k, const ad_real *B,
                                ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int rows, int cols, int accumulate);
/* A column micro-kernel computes rows x ncols of C (rows <= its height, ncols <= its width NC)
   from kc columns of op(A), a_k apart, each with its rows contiguous, and kc rows of NC values of
   B, ldb apart (B itself when it has NC columns, else a packed panel). */
typedef void (*ad__column_kernel)(int kc, const ad_real *A, ptrdiff_t a_k, const ad_real *B, ptrdiff_t ldb,
                                  ad_real *C, ptrdiff_t ldc, int rows, int ncols, int accumulate);

/* A narrow kernel computes rows x cols of C (rows <= its height, cols <= its width, one vector)
   from kc columns of op(A), element (i, k) at A[i * a_row + k * a_k], and kc rows of B read in
   place, ldb apart, but for the rows from k_in on, whose whole vector would run past B's end:
   those come from tail, a padded copy, one vector apart. */
typedef void (*ad__narrow_kernel)(int kc, const ad_real *A, ptrdiff_t a_row, ptrdiff_t a_k, const ad_real *B,
                                  ptrdiff_t ldb, int k_in, const ad_real *tail, ad_real *C, ptrdiff_t ldc,
                                  int rows, int cols, int accumulate);

typedef struct ad__gemm_kernel {
    ad__microkernel fn;          /* for packed A, whose strides it knows at compile time */
    ad__microkernel fn_strided;  /* for A in place; NULL where there is none */
    int mr, nr;
    ad__column_kernel columns;   /* for few columns and A stored by columns; NULL where none */
    int column_height, column_width;
    ad__narrow_kernel narrow;    /* for at most one vector of columns, B untransposed; NULL where none */
    int narrow_height, narrow_width;
    int spread;                  /* whether ad__gemm_spread takes nine or ten columns */
    int pack_b_reuse;            /* tiles that must read a crowded B in place before packing it
                                    pays (ad__gemm_pack_strided) */
} ad__gemm_kernel;

/* Copies n values, n < lanes <= 16, in pieces of 8, 4, 2 and 1: copies of a constant size become
   single moves, where a copy of n values would be a loop or a call. lanes is a constant in every
   caller, so the pieces that cannot occur drop out. */
AD__INLINE void ad__copy_part(ad_real *AD__RESTRICT dst, const ad_real *AD__RESTRICT src, int n, int lanes)
{
    int j = 0;
    if (lanes > 8 && (n & 8)) {
        memcpy(dst, src, 8 * sizeof(ad_real));
        j = 8;
    }
    if (lanes > 4 && (n & 4)) {
        memcpy(dst + j, src + j, 4 * sizeof(ad_real));
        j += 4;
    }
    if (lanes > 2 && (n & 2)) {
        memcpy(dst + j, src + j, 2 * sizeof(ad_real));
        j += 2;
    }
    if (n & 1) dst[j] = src[j];
}

#if AD__HAS_VECTOR_EXT
/* Stores the first n lanes of T, a vector of type VEC (VBYTES bytes, VL lanes), at DST, or adds
   them to what is there when ACC is set; all VL lanes when n >= VL. A part of a vector goes in
   pieces (ad__copy_part), so nothing past DST[n - 1] is read or written. */
#define AD__STORE_LANES(VEC, VBYTES, VL, DST, T, N, ACC)                                         \
    do {                                                                                         \
        VEC t_ = (T), old_;                                                                      \
        ad_real part_[VL];                                                                       \
        if ((N) >= VL) {                                                                         \
            if (ACC) {                                                                           \
                memcpy(&old_, (DST), VBYTES);                                                    \
                t_ += old_;                                                                      \
            }                                                                                    \
            memcpy((DST), &t_, VBYTES);                                                          \
        } else {                                                                                 \
            if (ACC) {                                                                           \
                memset(part_, 0, sizeof part_);                                                  \
                ad__copy_part(part_, (DST), (N), VL);                                            \
                memcpy(&old_, part_, VBYTES);                                                    \
                t_ += old_;                                                                      \
            }                                                                                    \
            memcpy(part_, &t_, VBYTES);                                                          \
            ad__copy_part((DST), part_, (N), VL);                                                \
        }                                                                                        \
    } while (0)
/* An MR x (NV vectors of VBYTES) micro-kernel. A holds kc columns of MR values, packed (PACKED
   1: the strides are MR and 1, known to the compiler) or anywhere (PACKED 0: a_row, a_k); B kc
   rows of NV * VL values, ldb apart (a packed panel, or B itself); the first rows x cols of the
   tile are stored to C (row stride ldc), or added to it when accumulate is set. An edge tile's
   part of a vector is stored in pieces, so nothing outside those rows x cols is touched.
   The tile is stored by NAME_store, given STORE_ATTR: kernels for 16 vector registers keep it
   apart (AD__NOINLINE), for with the stores in the same function GCC 12 kept one of the twelve
   accumulators of the 6 x 16 AVX2 tile on the stack through the whole loop (15 of 16 registers
   in use), a store and a load on every step, and the kernel ran at half speed; the AVX-512
   kernels, with 32 registers, take it inline. The loop over k is unrolled four times, so that
   its counter and pointer steps are a quarter as many beside the FMAs: the AVX-512 kernel on
   blocks in L2 ran at 0.945 of the FMA loop's speed against 0.905 rolled. */
#define AD__DEFINE_KERNEL(NAME, ATTR, VBYTES, MR, NV, PACKED, STORE_ATTR)                         \
    typedef ad_real NAME##_vec __attribute__((vector_size(VBYTES)));                            \
    static ATTR STORE_ATTR AD__UNUSED void NAME##_store(const NAME##_vec *tile, ad_real *C,    \
                                                         ptrdiff_t ldc, int rows, int cols,      \
                                                         int accumulate)                         \
    {                                                                                            \
        enum { VL = (int)(VBYTES / sizeof(ad_real)) };                                           \
        int i, j;                                                                                \
        if (rows == MR && cols == NV * VL) {                                                     \
            _Pragma("GCC unroll 16") for (i = 0; i < MR; i++)                                    \
            _Pragma("GCC unroll 16") for (j = 0; j < NV; j++)                                    \
                AD__STORE_LANES(NAME##_vec, VBYTES, VL, C + i * ldc + j * VL, tile[i * NV + j],  \
                                VL, accumulate);                                                 \
            return;                                                                              \
        }                                                                                        \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++) {                                      \
            if (i >= rows) break;                                                                \
            _Pragma("GCC unroll 16") for (j = 0; j < NV; j++) {                                  \
                if (cols <= j * VL) break;                                                       \
                AD__STORE_LANES(NAME##_vec, VBYTES, VL, C + i * ldc + j * VL, tile[i * NV + j],  \
                                cols - j * VL, accumulate);                                      \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    static ATTR AD__CODE_ALIGN AD__UNUSED void NAME(                                             \
        int kc, const ad_real *AD__RESTRICT A, ptrdiff_t a_row, ptrdiff_t a_k,                   \
        const ad_real *AD__RESTRICT B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int rows,       \
        int cols, int accumulate)                                                                \
    {                                                                                            \
        enum { VL = (int)(VBYTES / sizeof(ad_real)) };                                           \
        const ptrdiff_t row_step = PACKED ? 1 : a_row, k_step = PACKED ? MR : a_k;               \
        NAME##_vec c[MR][NV], tile[MR * NV], zero;                                               \
        int i, j, k;                                                                             \
        memset(&zero, 0, sizeof zero);                                                           \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++) {                                      \
            __builtin_prefetch(C + i * ldc, 1); /* the C tile arrives while A and B stream */    \
            __builtin_prefetch(C + i * ldc + NV * VL - 1, 1);                                    \
        }                                                                                        \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++)                                        \
        _Pragma("GCC unroll 16") for (j = 0; j < NV; j++) c[i][j] = zero;                        \
        _Pragma("GCC unroll 4") for (k = 0; k < kc; k++) {                                       \
            NAME##_vec b[NV];                                                                    \
            _Pragma("GCC unroll 16") for (j = 0; j < NV; j++)                                    \
                memcpy(&b[j], B + (ptrdiff_t)k * ldb + j * VL, VBYTES);                         \
            _Pragma("GCC unroll 16") for (i = 0; i < MR; i++) {                                  \
                NAME##_vec a = A[k * k_step + i * row_step] - zero; /* a - 0: a broadcast load */  \
                _Pragma("GCC unroll 16") for (j = 0; j < NV; j++) c[i][j] += a * b[j];           \
            }                                                                                    \
        }                                                                                        \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++)                                        \
        _Pragma("GCC unroll 16") for (j = 0; j < NV; j++) tile[i * NV + j] = c[i][j];            \
        NAME##_store(tile, C, ldc, rows, cols, accumulate);                                      \
    }
/* A narrow kernel (see ad__narrow_kernel), MR rows by one vector of VBYTES: for products with
   at most a vector's width of columns, such as a classifier's ten. B is read where it lies, so
   the product packs nothing but a few rows at B's end and a ragged last tile of A. */
#define AD__DEFINE_NARROW_KERNEL(NAME, ATTR, VBYTES, MR)                                         \
    typedef ad_real NAME##_vec __attribute__((vector_size(VBYTES)));                             \
    static ATTR AD__CODE_ALIGN AD__UNUSED void NAME(                                             \
        int kc, const ad_real *AD__RESTRICT A, ptrdiff_t a_row, ptrdiff_t a_k,                   \
        const ad_real *AD__RESTRICT B, ptrdiff_t ldb, int k_in, const ad_real *AD__RESTRICT tail, \
        ad_real *C, ptrdiff_t ldc, int rows, int cols, int accumulate)                           \
    {                                                                                            \
        enum { VL = (int)(VBYTES / sizeof(ad_real)) };                                           \
        NAME##_vec c[MR], zero;                                                                  \
        int i, k;                                                                                \
        memset(&zero, 0, sizeof zero);                                                           \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++) {                                      \
            __builtin_prefetch(C + i * ldc, 1);                                                  \
            c[i] = zero;                                                                         \
        }                                                                                        \
        for (k = 0; k < kc; k++) {                                                               \
            NAME##_vec b;                                                                        \
            memcpy(&b, k < k_in ? B + (ptrdiff_t)k * ldb : tail + (ptrdiff_t)(k - k_in) * VL, VBYTES); \
            _Pragma("GCC unroll 16") for (i = 0; i < MR; i++) c[i] += (A[k * a_k + i * a_row] - zero) * b; \
        }                                                                                        \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++) {                                      \
            if (i >= rows) break;                                                                \
            AD__STORE_LANES(NAME##_vec, VBYTES, VL, C + i * ldc, c[i], cols, accumulate);        \
        }                                                                                        \
    }
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
/* The shuffles below are the zero-masking forms with every lane kept: the plain forms of GCC
   12's intrinsics draw -Wuninitialized from g++ where they are inlined (GCC bug 105593). */
#define AD__EVERY_LANE ((__mmask16)0xFFFF)

/* The first n lanes of sixteen (all of them from 16 on, none for n <= 0). */
AD__INLINE __mmask16 ad__first_lanes(long long n)
{
    return (__mmask16)(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1);
}

/* Sixteen rows of C from x[j], rows 0-15 of column j (j < nc <= 16), by a transpose in
   registers: pairs of columns interleaved within each 128-bit lane, then pairs of pairs, so that
   lane L of u[g][r] holds row 4L + r of columns 4g to 4g + 3; then each row gathers its lane L
   from the four groups. Columns from nc on are zeros, and groups of them are not shuffled. The
   first ncols values of each of the first rows rows are stored, or added to C, with every load
   of C made before the first store: a load that overlaps a masked store still in flight waits for
   it (6% of a 128 x 10 tile from k = 64 on Zen 4). */
AD__HOT __attribute__((target("avx512f"))) void ad__column_rows_store(const __m512 *x, int nc, float *C, ptrdiff_t ldc,
                                                                     int rows, int ncols, int accumulate)
{
    const __m512 zero = _mm512_setzero_ps();
    const __mmask16 lanes = ad__first_lanes(ncols);
    __m512 u[4][4], row[16];
    int g, r, k;
#pragma GCC unroll 4
    for (g = 0; g < 4; g++) {
        __m512 a[4];
        __m512d t[4];
        if (4 * g >= nc) {
            for (r = 0; r < 4; r++) u[g][r] = zero;
            continue;
        }
        for (k = 0; k < 4; k++) a[k] = 4 * g + k < nc ? x[4 * g + k] : zero;
        t[0] = _mm512_castps_pd(_mm512_maskz_unpacklo_ps(AD__EVERY_LANE, a[0], a[1]));
        t[1] = _mm512_castps_pd(_mm512_maskz_unpackhi_ps(AD__EVERY_LANE, a[0], a[1]));
        t[2] = _mm512_castps_pd(4 * g + 2 < nc ? _mm512_maskz_unpacklo_ps(AD__EVERY_LANE, a[2], a[3]) : zero);
        t[3] = _mm512_castps_pd(4 * g + 2 < nc ? _mm512_maskz_unpackhi_ps(AD__EVERY_LANE, a[2], a[3]) : zero);
        u[g][0] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd((__mmask8)0xFF, t[0], t[2]));
        u[g][1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd((__mmask8)0xFF, t[0], t[2]));
        u[g][2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd((__mmask8)0xFF, t[1], t[3]));
        u[g][3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd((__mmask8)0xFF, t[1], t[3]));
    }
#pragma GCC unroll 4
    for (r = 0; r < 4; r++) {
        /* lanes 0-1 of groups 0 and 1, lanes 2-3 of the same, and so for groups 2 and 3 */
        const __m512 lo01 = _mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, u[0][r], u[1][r], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 hi01 = _mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, u[0][r], u[1][r], _MM_SHUFFLE(3, 2, 3, 2));
        const __m512 lo23 = _mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, u[2][r], u[3][r], _MM_SHUFFLE(1, 0, 1, 0));
        const __m512 hi23 = _mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, u[2][r], u[3][r], _MM_SHUFFLE(3, 2, 3, 2));
        row[r] = _mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, lo01, lo23, _MM_SHUFFLE(2, 0, 2, 0));
        row[4 + r] = _mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, lo01, lo23, _MM_SHUFFLE(3, 1, 3, 1));
        row[8 + r] = _mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, hi01, hi23, _MM_SHUFFLE(2, 0, 2, 0));
        row[12 + r] = _mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, hi01, hi23, _MM_SHUFFLE(3, 1, 3, 1));
    }
    if (accumulate) {
#pragma GCC unroll 16
        for (r = 0; r < 16; r++)
            if (r < rows) row[r] = _mm512_add_ps(row[r], _mm512_maskz_loadu_ps(lanes, C + (ptrdiff_t)r * ldc));
    }
#pragma GCC unroll 16
    for (r = 0; r < 16; r++)
        if (r < rows) _mm512_mask_storeu_ps(C + (ptrdiff_t)r * ldc, lanes, row[r]);
}

/* A column kernel's tile stored as rows of C: tile holds nc columns of mv vectors of sixteen
   rows (column j's rows from 16v on in vector j * mv + v); its first rows x ncols values. */
AD__HOT __attribute__((target("avx512f"))) void ad__column_tile_store(const void *tile, int nc, int mv, float *C,
                                                                     ptrdiff_t ldc, int rows, int ncols,
                                                                     int accumulate)
{
    const unsigned char *vectors = (const unsigned char *)tile;
    int v, j;
#pragma GCC unroll 4
    for (v = 0; v < mv; v++) {
        __m512 x[16];
        if (16 * v >= rows) break;
#pragma GCC unroll 16
        for (j = 0; j < nc; j++) memcpy(&x[j], vectors + (ptrdiff_t)(j * mv + v) * 64, 64);
        ad__column_rows_store(x, nc, C + (ptrdiff_t)16 * v * ldc, ldc, rows - 16 * v, ncols, accumulate);
    }
}
#elif AD__X86_DISPATCH
/* The same for doubles, value by value: column j's rows are tile[j * mv * 8] on. */
AD__HOT void ad__column_tile_store(const void *tile, int nc, int mv, double *C, ptrdiff_t ldc, int rows,
                                   int ncols, int accumulate)
{
    const double *t = (const double *)tile;
    const int height = 8 * mv;
    int i, j;
    for (i = 0; i < rows; i++) {
        double *dst = C + (ptrdiff_t)i * ldc;
        if (ncols == nc && accumulate) {
#pragma GCC unroll 16
            for (j = 0; j < nc; j++) dst[j] += t[j * height + i];
        } else if (ncols == nc) {
#pragma GCC unroll 16
            for (j = 0; j < nc; j++) dst[j] = t[j * height + i];
        } else {
            for (j = 0; j < ncols; j++) dst[j] = accumulate ? dst[j] + t[j * height + i] : t[j * height + i];
        }
    }
}
#endif
/* A column micro-kernel (see ad__column_kernel) with MV vectors of VBYTES down the rows and NC
   columns: for a product with few columns, each column of C a broadcast and each vector a run of
   rows, so no lane goes to columns C does not have. The tile is stored transposed
   (ad__column_tile_store). */
#define AD__DEFINE_COLUMN_KERNEL(NAME, ATTR, VBYTES, MV, NC)                                      \
    typedef ad_real NAME##_vec __attribute__((vector_size(VBYTES)));                            \
    static ATTR AD__CODE_ALIGN AD__UNUSED void NAME(                                             \
        int kc, const ad_real *AD__RESTRICT A, ptrdiff_t a_k, const ad_real *AD__RESTRICT B,     \
        ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int rows, int ncols, int accumulate)           \
    {                                                                                            \
        enum { VL = (int)(VBYTES / sizeof(ad_real)) };                                           \
        NAME##_vec c[NC][MV], zero;                                                              \
        int j, k, v;                                                                             \
        memset(&zero, 0, sizeof zero);                                                           \
        _Pragma("GCC unroll 16") for (j = 0; j < NC; j++)                                        \
        _Pragma("GCC unroll 16") for (v = 0; v < MV; v++) c[j][v] = zero;                        \
        for (k = 0; k < kc; k++) {                                                               \
            NAME##_vec a[MV];                                                                    \
            _Pragma("GCC unroll 16") for (v = 0; v < MV; v++)                                    \
                memcpy(&a[v], A + k * a_k + v * VL, VBYTES);                                     \
            _Pragma("GCC unroll 16") for (j = 0; j < NC; j++) {                                  \
                NAME##_vec b = B[k * ldb + j] - zero;                                            \
                _Pragma("GCC unroll 16") for (v = 0; v < MV; v++) c[j][v] += a[v] * b;           \
            }                                                                                    \
        }                                                                                        \
        ad__column_tile_store(c, NC, MV, C, ldc, rows, ncols, accumulate);                       \
    }
#if AD__X86_DISPATCH
/* up to 24 accumulators need AVX-512's 32 registers; ten columns are a classifier's */
AD__DEFINE_COLUMN_KERNEL(ad__columns8_avx512, __attribute__((target("avx512f,avx2,fma"))), 64, 2, 8)
AD__DEFINE_COLUMN_KERNEL(ad__columns10_avx512, __attribute__((target("avx512f,avx2,fma"))), 64, 2, 10)
AD__DEFINE_COLUMN_KERNEL(ad__columns12_avx512, __attribute__((target("avx512f,avx2,fma"))), 64, 2, 12)
#endif
#if AD__X86_DISPATCH
AD__DEFINE_NARROW_KERNEL(ad__narrow_avx2, __attribute__((target("avx2,fma"))), 32, 8)
AD__DEFINE_NARROW_KERNEL(ad__narrow_avx512, __attribute__((target("avx512f,avx2,fma"))), 64, 8)
#endif
#undef AD__DEFINE_NARROW_KERNEL
#undef AD__DEFINE_COLUMN_KERNEL

/* Products with nine or ten columns (a classifier's ten), neither operand transposed, so that
   A's rows run along k. A vector of ten columns, as in the narrow kernel, leaves six of sixteen
   lanes idle, and the column kernels need A's columns. Here the values of k are spread over a
   vector's lanes instead. B is packed in blocks of eight k, 80 floats a block
   (ad__pack_spread_b): four vectors hold four columns for four k each (lane 4c + s: column c or
   4 + c at k = s or 4 + s), read against A's four values at those k broadcast as one 128-bit
   run; the fifth holds columns 8 and 9 for all eight k (lane 8c + s: column 8 + c at k = s),
   read against A's eight values broadcast as one 256-bit run. A row of C has three
   accumulators whose lanes are partial sums over k, added up at the end by trees of
   neighbouring lanes. Every lane does work, each of A's values loaded serves two or more
   multiply-adds (one broadcast a multiply-add ran at 72% of the FMA rate on Zen 4), and each
   row is added up the same way whatever its tile or thread. */
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
enum { AD__SPREAD_K = 8, AD__SPREAD_BLOCK = 80, AD__SPREAD_ROWS = 8 };

/* Where value (k = s, column j) of a block goes in the spread layout. */
AD__INLINE int ad__spread_slot(int s, int j)
{
    return j < 8 ? 16 * (2 * (s / 4) + j / 4) + 4 * (j % 4) + s % 4 : 64 + 8 * (j - 8) + s;
}

/* The inverse of ad__spread_slot for vector v of a block: lane l gets value 10 s + j of a block of
   B with ten columns one row after another (k = s, column j), where ad__spread_slot(s, j) is
   16 v + l. */
AD__INLINE __attribute__((target("avx512f"))) __m512i ad__spread_sources(__m512i lane, int v)
{
    __m512i s, j;
    if (v < 4) {
        s = _mm512_add_epi32(_mm512_set1_epi32(4 * (v / 2)), _mm512_and_si512(lane, _mm512_set1_epi32(3)));
        j = _mm512_add_epi32(_mm512_set1_epi32(4 * (v % 2)), _mm512_maskz_srli_epi32(AD__EVERY_LANE, lane, 2));
    } else {
        s = _mm512_and_si512(lane, _mm512_set1_epi32(7));
        j = _mm512_add_epi32(_mm512_set1_epi32(8), _mm512_maskz_srli_epi32(AD__EVERY_LANE, lane, 3));
    }
    return _mm512_add_epi32(_mm512_mullo_epi32(s, _mm512_set1_epi32(10)), j);
}

/* Rows pc..pc+kc-1 of B (not transposed, 9 or 10 columns) in the spread layout, the last block
   padded with zeros. A block of a B of ten columns with its rows one after another (a
   classifier's weights) is 80 consecutive values, five vectors; each vector of the layout picks
   its lanes from two or three pairs of them (in[4] paired with itself) by two-source
   permutations, 11 a block. The permutations' indices and masks are constants, which GCC
   folds, so that a product's packing costs its blocks alone. Other blocks (nine columns, rows
   further apart, a last short block) are first staged as such 80 values, with zeros. */
AD__PRIVATE __attribute__((target("avx512f"))) void ad__pack_spread_b(const float *B, ptrdiff_t ldb, int pc, int kc,
                                                                      int N, float *dst)
{
    static const unsigned char first_pair[5] = {0, 0, 1, 1, 0}, last_pair[5] = {1, 1, 2, 2, 2};
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __mmask16 columns = ad__first_lanes(N), ten = ad__first_lanes(10);
    int s, v, p, k0;
    float staged[AD__SPREAD_BLOCK];
    __m512i index[5];
    __mmask16 from_pair[5][3];
#pragma GCC unroll 5
    for (v = 0; v < 5; v++) {
        const __m512i source = ad__spread_sources(lanes, v);
        index[v] = _mm512_and_si512(source, _mm512_set1_epi32(31)); /* within a pair of vectors */
#pragma GCC unroll 3
        for (p = 0; p < 3; p++)
            from_pair[v][p] = _mm512_cmpeq_epi32_mask(_mm512_maskz_srli_epi32(AD__EVERY_LANE, source, 5),
                                                      _mm512_set1_epi32(p));
    }
    for (k0 = 0; k0 < kc; k0 += AD__SPREAD_K, dst += AD__SPREAD_BLOCK) {
        const float *block = B + ((ptrdiff_t)pc + k0) * ldb;
        __m512 in[6];
        if (N != 10 || ldb != 10 || kc - k0 < AD__SPREAD_K) {
            for (s = 0; s < AD__SPREAD_K; s++)
                _mm512_mask_storeu_ps(staged + 10 * s, ten,
                                      k0 + s < kc ? _mm512_maskz_loadu_ps(columns, block + s * ldb) : _mm512_setzero_ps());
            block = staged;
        }
#pragma GCC unroll 5
        for (p = 0; p < 5; p++) in[p] = _mm512_loadu_ps(block + 16 * p);
        in[5] = in[4]; /* not read: values 64-79 lie in the first of their pair */
#pragma GCC unroll 5
        for (v = 0; v < 5; v++) {
            __m512 out = _mm512_setzero_ps();
#pragma GCC unroll 3
            for (p = 0; p < 3; p++)
                if (p >= first_pair[v] && p <= last_pair[v])
                    out = _mm512_mask_mov_ps(out, from_pair[v][p], _mm512_permutex2var_ps(in[2 * p], index[v], in[2 * p + 1]));
            _mm512_storeu_ps(dst + 16 * v, out);
        }
    }
}

/* Sums of neighbouring lanes of x and y: in each 128-bit quarter, x0 + x1, x2 + x3, y0 + y1,
   y2 + y3. */
AD__INLINE __attribute__((target("avx512f"))) __m512 ad__neighbour_sums(__m512 x, __m512 y)
{
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* One block of eight k for eight rows, row r's eight values of A at a[r] + k. */
AD__INLINE __attribute__((target("avx512f"))) void ad__spread_step(const float *const *a, int k, const float *pb,
                                                                   __m512 (*quads)[2], __m512 *eights)
{
    const __m512 q0 = _mm512_loadu_ps(pb), q1 = _mm512_loadu_ps(pb + 16), q2 = _mm512_loadu_ps(pb + 32),
                 q3 = _mm512_loadu_ps(pb + 48), e = _mm512_loadu_ps(pb + 64);
    int r;
#pragma GCC unroll 8
    for (r = 0; r < AD__SPREAD_ROWS; r++) {
        const float *x = a[r] + k;
        const __m512 low = _mm512_broadcast_f32x4(_mm_loadu_ps(x)), high = _mm512_broadcast_f32x4(_mm_loadu_ps(x + 4));
        const __m512 all = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(x))));
        quads[r][0] = _mm512_fmadd_ps(low, q0, quads[r][0]);
        quads[r][1] = _mm512_fmadd_ps(low, q1, quads[r][1]);
        quads[r][0] = _mm512_fmadd_ps(high, q2, quads[r][0]);
        quads[r][1] = _mm512_fmadd_ps(high, q3, quads[r][1]);
        eights[r] = _mm512_fmadd_ps(all, e, eights[r]);
    }
}

/* The tile's rows added up and stored (added to C when accumulating), cols values a row. The
   quads of rows (2i, 2i + 1) give, in lane 4c + 2h + g, C[2i + h, 4g + c]; the eights of all
   rows give columns 8 and 9 in one vector: rows 0-3 of column 8 in lanes 0-3, of column 9 in
   4-7, rows 4-7 in 8-11 and 12-15. Each row's ten values are gathered from the two by one
   permutation. */
AD__INLINE __attribute__((target("avx512f"))) void ad__spread_store(__m512 (*quads)[2], const __m512 *eights,
                                                                    float *C, ptrdiff_t ldc, int rows, int cols,
                                                                    int accumulate)
{
    const __mmask16 lanes = ad__first_lanes(cols);
    const __m512i row0 = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 16, 20, 0, 0, 0, 0, 0, 0);
    __m512 p[AD__SPREAD_ROWS / 2], e[AD__SPREAD_ROWS / 2], f0, f1, tens;
    int i, r;
#pragma GCC unroll 4
    for (i = 0; i < AD__SPREAD_ROWS / 2; i++) {
        p[i] = ad__neighbour_sums(ad__neighbour_sums(quads[2 * i][0], quads[2 * i][1]),
                                  ad__neighbour_sums(quads[2 * i + 1][0], quads[2 * i + 1][1]));
        e[i] = ad__neighbour_sums(eights[2 * i], eights[2 * i + 1]);
    }
    f0 = ad__neighbour_sums(e[0], e[1]);
    f1 = ad__neighbour_sums(e[2], e[3]);
    tens = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, f0, f1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_maskz_shuffle_f32x4(AD__EVERY_LANE, f0, f1, _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 8
    for (r = 0; r < AD__SPREAD_ROWS; r++) {
        /* row r's lanes: row0's, two further in the quads for an odd row, its own in tens */
        const __m512i shift = _mm512_mask_set1_epi32(_mm512_set1_epi32(2 * (r & 1)), 0x300, r < 4 ? r : r + 4);
        float *c = C + (ptrdiff_t)r * ldc;
        __m512 v;
        if (r >= rows) break;
        v = _mm512_permutex2var_ps(p[r / 2], _mm512_add_epi32(row0, shift), tens);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, c));
        _mm512_mask_storeu_ps(c, lanes, v);
    }
}

/* rows (at most eight) x cols (at most ten) of C from kc values of k: A's rows lda apart, B
   packed by ad__pack_spread_b. Rows past `rows` read the last row again; the values of a last,
   partial block of k are copied with zeros after them, so nothing past A is read. The copy is
   made inside the loop (a[r] then points at it, k - from at 0) so that the accumulators stay in
   registers: with a second call of the step after the loop GCC kept them in memory. */
AD__PRIVATE __attribute__((target("avx512f"))) void ad__spread_kernel(int kc, const float *A, ptrdiff_t lda,
                                                                      const float *pb, float *C, ptrdiff_t ldc,
                                                                      int rows, int cols, int accumulate)
{
    enum { R = AD__SPREAD_ROWS, KB = AD__SPREAD_K };
    const float *a[R];
    float tail[R][KB];
    __m512 quads[R][2], eights[R];
    int r, s, k, from = 0, whole = kc / KB * KB;
#pragma GCC unroll 8
    for (r = 0; r < R; r++) { /* unrolled, or GCC zeroes the accumulators through memory */
        a[r] = A + (ptrdiff_t)(r < rows ? r : rows - 1) * lda;
        quads[r][0] = quads[r][1] = eights[r] = _mm512_setzero_ps();
    }
    for (k = 0; k < kc; k += KB, pb += AD__SPREAD_BLOCK) {
        if (k == whole) {
            for (r = 0; r < R; r++) {
                for (s = 0; s < KB; s++) tail[r][s] = k + s < kc ? a[r][k + s] : 0;
                a[r] = tail[r];
            }
            from = k;
        }
        ad__spread_step(a, k - from, pb, quads, eights);
    }
    ad__spread_store(quads, eights, C, ldc, rows, cols, accumulate);
}
#endif

AD__DEFINE_KERNEL(ad__kernel_generic, , 16, 6, 2, 1, AD__NOINLINE)
AD__DEFINE_KERNEL(ad__kernel_generic_strided, , 16, 6, 2, 0, AD__NOINLINE)
#if AD__X86_DISPATCH
AD__DEFINE_KERNEL(ad__kernel_avx2, __attribute__((target("avx2,fma"))), 32, 6, 2, 1, AD__NOINLINE)
AD__DEFINE_KERNEL(ad__kernel_avx2_strided, __attribute__((target("avx2,fma"))), 32, 6, 2, 0, AD__NOINLINE)
AD__DEFINE_KERNEL(ad__kernel_avx512, __attribute__((target("avx512f,avx2,fma"))), 64, 8, 2, 1, AD__ALWAYS_INLINE AD__INLINE_KEYWORD)
AD__DEFINE_KERNEL(ad__kernel_avx512_strided, __attribute__((target("avx512f,avx2,fma"))), 64, 8, 2, 0, AD__ALWAYS_INLINE AD__INLINE_KEYWORD)
AD__DEFINE_KERNEL(ad__kernel_avx512_narrow, __attribute__((target("avx512f,avx2,fma"))), 64, 8, 1, 1, AD__ALWAYS_INLINE AD__INLINE_KEYWORD)
AD__DEFINE_KERNEL(ad__kernel_avx512_narrow_strided, __attribute__((target("avx512f,avx2,fma"))), 64, 8, 1, 0, AD__ALWAYS_INLINE AD__INLINE_KEYWORD)
#endif
#undef AD__DEFINE_KERNEL
#undef AD__STORE_LANES
#else
/* Plain C: a 4 x 4 tile. */
static void ad__kernel_generic(int kc, const ad_real *AD__RESTRICT A, ptrdiff_t a_row, ptrdiff_t a_k,
                               const ad_real *AD__RESTRICT B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc,
                               int rows, int cols, int accumulate)
{
    ad_real c[4][4] = {{0}};
    int i, j, k;
    for (k = 0; k < kc; k++)
        for (i = 0; i < 4; i++)
            for (j = 0; j < 4; j++) c[i][j] += A[k * a_k + i * a_row] * B[k * ldb + j];
    for (i = 0; i < rows; i++)
        for (j = 0; j < cols; j++) C[i * ldc + j] = accumulate ? C[i * ldc + j] + c[i][j] : c[i][j];
}
#endif

/* The widest micro-kernel this processor runs; a one-vector-wide one for narrow products. */
AD__PRIVATE ad__gemm_kernel ad__gemm_pick(int N)
{
    ad__gemm_kernel k;
    k.columns = NULL;
    k.column_height = k.column_width = 0;
    k.narrow = NULL;
    k.narrow_height = k.narrow_width = 0;
    k.spread = 0;
    k.pack_b_reuse = 4;
#if AD__X86_DISPATCH
    if (ad__isa() == AD__ISA_AVX512) {
        int narrow = N <= 64 / (int)sizeof(ad_real);
        k.fn = narrow ? ad__kernel_avx512_narrow : ad__kernel_avx512;
        k.fn_strided = narrow ? ad__kernel_avx512_narrow_strided : ad__kernel_avx512_strided;
        k.mr = 8;
        k.nr = (narrow ? 1 : 2) * 64 / (int)sizeof(ad_real);
        k.columns = N <= 8 ? ad__columns8_avx512 : N <= 10 ? ad__columns10_avx512 : ad__columns12_avx512;
        k.column_height = 2 * 64 / (int)sizeof(ad_real);
        k.column_width = N <= 8 ? 8 : N <= 10 ? 10 : 12;
        k.narrow = ad__narrow_avx512;
        k.narrow_height = 8;
        k.narrow_width = 64 / (int)sizeof(ad_real);
#ifndef AUTODIFF_DOUBLE
        k.spread = 1;
#endif
        return k;
    }
    if (ad__isa() == AD__ISA_AVX2) {
        k.fn = ad__kernel_avx2;
        k.fn_strided = ad__kernel_avx2_strided;
        k.pack_b_reuse = 8;
        k.mr = 6;
        k.nr = 2 * 32 / (int)sizeof(ad_real);
        k.narrow = ad__narrow_avx2;
        k.narrow_height = 8;
        k.narrow_width = 32 / (int)sizeof(ad_real);
        return k;
    }
#endif
    (void)N;
    k.fn = ad__kernel_generic;
#if AD__HAS_VECTOR_EXT
    k.fn_strided = ad__kernel_generic_strided;
    k.mr = 6;
    k.nr = 2 * 16 / (int)sizeof(ad_real);
#else
    k.fn_strided = ad__kernel_generic;
    k.mr = 4;
    k.nr = 4;
#endif
    return k;
}

#if AD__X86_DISPATCH && AD__HAS_SHUFFLE && !defined(AUTODIFF_DOUBLE)
#define AD__PACK_BT_FAST 1
typedef float ad__v8 __attribute__((vector_size(32)));
typedef float ad__v8_unaligned __attribute__((vector_size(32), aligned(4)));

/* Transposes the 8 x 8 block of floats in r (row i in r[i]) into o (column j in o[j]), in three
   rounds of shuffles: pairs, then quads, then halves of rows are interleaved. */
AD__INLINE AD__ALWAYS_INLINE __attribute__((target("avx2"))) void ad__transpose8_regs(const ad__v8 *r, ad__v8 *o)
{
    ad__v8 t[8], u[8];
    int i;
    _Pragma("GCC unroll 4") for (i = 0; i < 8; i += 2) {
        t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    _Pragma("GCC unroll 2") for (i = 0; i < 8; i += 4) {
        u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    _Pragma("GCC unroll 4") for (i = 0; i < 4; i++) {
        o[i] = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        o[i + 4] = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

/* Transposes the 8 x 8 block of floats at src (rows ld apart) into dst (rows dst_ld apart). */
AD__INLINE AD__ALWAYS_INLINE __attribute__((target("avx2"))) void ad__transpose8(const float *src, ptrdiff_t ld,
                                                                                 float *dst, ptrdiff_t dst_ld)
{
    ad__v8 r[8], o[8];
    int i;
    _Pragma("GCC unroll 8") for (i = 0; i < 8; i++) r[i] = *(const ad__v8_unaligned *)(src + i * ld);
    ad__transpose8_regs(r, o);
    _Pragma("GCC unroll 8") for (i = 0; i < 8; i++) *(ad__v8_unaligned *)(dst + i * dst_ld) = o[i];
}

/* A panel of six rows of A (the AVX2 kernel's), kc values of each from src on, rows lda apart,
   into dst[k * 6 + r], through 8 x 8 transposes of the six rows and two copies of the last: each
   column's eight values are stored whole, the next column's store overwriting the two extra,
   but for the block's last column, of which six are stored. One value at a time, the copy took
   a fifth of the time of a 64 x 784 . 784 x 128 product. */
AD__PRIVATE __attribute__((target("avx2"))) void ad__pack_a6_panel(const float *src, ptrdiff_t lda, int kc,
                                                                   float *AD__RESTRICT dst)
{
    int k, r;
    for (k = 0; k + 8 <= kc; k += 8) {
        ad__v8 rows[8], cols[8];
        float *d = dst + (size_t)k * 6;
        _Pragma("GCC unroll 6") for (r = 0; r < 6; r++) rows[r] = *(const ad__v8_unaligned *)(src + r * lda + k);
        rows[6] = rows[7] = rows[5];
        ad__transpose8_regs(rows, cols);
        _Pragma("GCC unroll 7") for (r = 0; r < 7; r++) *(ad__v8_unaligned *)(d + r * 6) = cols[r];
        memcpy(d + 7 * 6, &cols[7], 6 * sizeof(float));
    }
    for (; k < kc; k++)
        for (r = 0; r < 6; r++) dst[(size_t)k * 6 + r] = src[r * lda + k];
}

/* A panel that transposes what it packs, in 8 x 8 blocks: nr rows (nr a multiple of 8), kc values
   of each from src on, rows ldb apart, into dst[k * nr + c]. Whole panels of a transposed B and
   of an untransposed A are packed so. A copy one value at a time would do one store per value,
   which took a quarter of a g . W^T product's time. */
AD__PRIVATE __attribute__((target("avx2"))) void ad__pack_bt_panel(const float *src, ptrdiff_t ldb, int kc,
                                                                   int nr, float *AD__RESTRICT dst)
{
    int c, k;
    for (c = 0; c < nr; c += 8) {
        const float *s = src + (ptrdiff_t)c * ldb;
        for (k = 0; k + 8 <= kc; k += 8) ad__transpose8(s + k, ldb, dst + (size_t)k * nr + c, nr);
        for (; k < kc; k++) {
            int i;
            for (i = 0; i < 8; i++) dst[(size_t)k * nr + c + i] = s[(ptrdiff_t)i * ldb + k];
        }
    }
}
#else
#define AD__PACK_BT_FAST 0
#endif

/* Packs group panels of mr rows of a transposed A (op(A)'s rows are A's columns, so a panel's mr
   values for each k lie side by side in A's row k0 + k), from column i0 of A on. */
AD__INLINE AD__ALWAYS_INLINE void ad__pack_at_group(const ad_real *A, ptrdiff_t lda, int i0, int k0, int kc,
                                                    int mr, int group, ad_real *AD__RESTRICT dst)
{
    const ad_real *src = A + (ptrdiff_t)k0 * lda + i0;
    int k, q;
    for (k = 0; k < kc; k++, src += lda)
        for (q = 0; q < group; q++)
            memcpy(dst + (size_t)q * mr * kc + (size_t)k * mr, src + q * mr, (size_t)mr * sizeof(ad_real));
}

/* Packs the whole panels of mr rows (8 or 6, the kernels' heights) of a transposed A, four at a
   time: each line of A is read once. Panel by panel, a panel took part of each line, and A's
   rows, a power of two apart, crowd a few L1 sets, so the line was gone when the next panel came
   for the rest: h^T g of a GPT's MLP (h 768 x 512) packs 1.5-2.0x faster four at a time. More at
   a time was slower (eight 1.4x, all eighteen of a block 0.8x): the panels being written lie
   mr x kc values apart, 8 KiB with kc 256, all in one L1 set. The groups of four are calls with
   constant sizes, whose copies the compiler lays out straight: with the group's size a variable,
   the packing was no faster than panel by panel. Returns the rows packed. */
AD__PRIVATE int ad__pack_at_panels(const ad_real *A, ptrdiff_t lda, int i0, int mc, int k0, int kc, int mr,
                                   ad_real *AD__RESTRICT dst)
{
    int panels = mc / mr, p;
    for (p = 0; p + 4 <= panels; p += 4) {
        if (mr == 8) ad__pack_at_group(A, lda, i0 + p * mr, k0, kc, 8, 4, dst + (size_t)p * mr * kc);
        else ad__pack_at_group(A, lda, i0 + p * mr, k0, kc, 6, 4, dst + (size_t)p * mr * kc);
    }
    if (p < panels) { /* the last one to three */
        if (mr == 8) ad__pack_at_group(A, lda, i0 + p * mr, k0, kc, 8, panels - p, dst + (size_t)p * mr * kc);
        else ad__pack_at_group(A, lda, i0 + p * mr, k0, kc, 6, panels - p, dst + (size_t)p * mr * kc);
    }
    return panels * mr;
}

/* Packs rows i0..i0+mc-1, columns k0..k0+kc-1 of op(A) into panels of mr rows (zero-padded). */
AD__PRIVATE AD__CODE_ALIGN void ad__pack_a(int ta, const ad_real *A, ptrdiff_t lda, int i0, int mc, int k0,
                                           int kc, int mr, ad_real *AD__RESTRICT dst)
{
    int p = 0, r, k;
    if (ta && (mr == 8 || mr == 6)) {
        p = ad__pack_at_panels(A, lda, i0, mc, k0, kc, mr, dst);
        dst += (size_t)p * kc;
    }
    for (; p < mc; p += mr, dst += (size_t)mr * kc) {
        int rows = mc - p < mr ? mc - p : mr;
        if (!ta && mr == 8 && rows == 8) {
            /* a full panel of eight rows, not transposed: 8 x 8 register transposes where the
               processor has AVX2, else eight read streams and one contiguous write, with
               constant trip counts the compiler turns into straight-line code */
            const ad_real *s = A + (ptrdiff_t)(i0 + p) * lda + k0;
#if AD__PACK_BT_FAST
            if (ad__isa() >= AD__ISA_AVX2) {
                ad__pack_bt_panel(s, lda, kc, 8, dst);
                continue;
            }
#endif
            for (k = 0; k < kc; k++) {
                ad_real *d = dst + (size_t)k * 8;
                d[0] = s[k];
                d[1] = s[lda + k];
                d[2] = s[2 * lda + k];
                d[3] = s[3 * lda + k];
                d[4] = s[4 * lda + k];
                d[5] = s[5 * lda + k];
                d[6] = s[6 * lda + k];
                d[7] = s[7 * lda + k];
            }
            continue;
        }
        if (!ta) {
#if AD__PACK_BT_FAST
            if (mr == 6 && rows == 6 && ad__isa() >= AD__ISA_AVX2) {
                ad__pack_a6_panel(A + (ptrdiff_t)(i0 + p) * lda + k0, lda, kc, dst);
                continue;
            }
#endif
            for (r = 0; r < rows; r++) {
                const ad_real *src = A + (ptrdiff_t)(i0 + p + r) * lda + k0;
                for (k = 0; k < kc; k++) dst[(size_t)k * mr + r] = src[k];
            }
        } else {
            /* in pieces of constant size: a loop over rows, GCC turns into a call to memcpy for
               every k (a fifth of the time of h^T . g on AVX2) */
            for (k = 0; k < kc; k++) {
                const ad_real *src = A + (ptrdiff_t)(k0 + k) * lda + i0 + p;
                ad_real *d = dst + (size_t)k * mr;
                for (r = 0; r + 8 <= rows; r += 8) memcpy(d + r, src + r, 8 * sizeof(ad_real));
                ad__copy_part(d + r, src + r, rows - r, 8);
            }
        }
        for (r = rows; r < mr; r++)
            for (k = 0; k < kc; k++) dst[(size_t)k * mr + r] = 0;
    }
}

/* Packs whole panels of an untransposed B (nr a multiple of 16) row by row: each row of B is
   read from start to end, a stream the hardware prefetchers follow, and its pieces go to the
   panels. Panel by panel, the reads would stride down B a panel's width at a time: x W1 of the
   large MLP (W1 784 rows 2 KiB apart, packed 32 columns a panel) ran 1.08x faster row by row. */
AD__PRIVATE AD__CODE_ALIGN void ad__pack_b_rows(const ad_real *B, ptrdiff_t ldb, int k0, int kc, int j0,
                                                int panels, int nr, ad_real *AD__RESTRICT dst)
{
    int k, p, c;
    for (k = 0; k < kc; k++) {
        const ad_real *src = B + (ptrdiff_t)(k0 + k) * ldb + j0;
        ad_real *d = dst + (size_t)k * nr;
        for (p = 0; p < panels; p++, src += nr, d += (size_t)nr * kc)
            for (c = 0; c < nr; c += 16) memcpy(d + c, src + c, 16 * sizeof(ad_real));
    }
}

/* Packs rows k0..k0+kc-1, columns j0..j0+nc-1 of op(B) into panels of nr columns. B's values
   end at b_end. A last, partial panel of an untransposed B is copied in whole blocks of 16 where
   those stay before b_end: its extra columns then hold whatever follows in B, which only reaches
   columns of edge tiles that are never stored. Two or more whole panels of an untransposed B go
   row by row (ad__pack_b_rows); whole panels of a transposed B through 8 x 8 register transposes
   where the processor has AVX2. */
AD__PRIVATE AD__CODE_ALIGN void ad__pack_b(int tb, const ad_real *B, ptrdiff_t ldb, const ad_real *b_end,
                                           int k0, int kc, int j0, int nc, int nr, ad_real *AD__RESTRICT dst)
{
    int p = 0, c, k, panels = nc / nr;
    if (!tb && nr % 16 == 0 && panels > 1) { /* the whole panels; a part of one goes below */
        ad__pack_b_rows(B, ldb, k0, kc, j0, panels, nr, dst);
        p = panels * nr;
        dst += (size_t)panels * nr * kc;
    }
    for (; p < nc; p += nr, dst += (size_t)nr * kc) {
        int cols = nc - p < nr ? nc - p : nr, whole = (cols + 15) / 16 * 16;
        if (!tb) {
            for (k = 0; k < kc; k++) {
                const ad_real *src = B + (ptrdiff_t)(k0 + k) * ldb + j0 + p;
                ad_real *d = dst + (size_t)k * nr;
                /* copies of a constant size are inlined; a loop over cols becomes a call */
                if (whole <= nr && b_end - src >= whole) {
                    for (c = 0; c < whole; c += 16) memcpy(d + c, src + c, 16 * sizeof(ad_real));
                    continue;
                }
                for (c = 0; c + 16 <= cols; c += 16) memcpy(d + c, src + c, 16 * sizeof(ad_real));
                for (; c < cols; c++) d[c] = src[c];
                for (; c < nr; c++) d[c] = 0;
            }
        } else {
#if AD__PACK_BT_FAST
            if (cols == nr && nr % 8 == 0 && ad__isa() >= AD__ISA_AVX2) {
                ad__pack_bt_panel(B + (ptrdiff_t)(j0 + p) * ldb + k0, ldb, kc, nr, dst);
                continue;
            }
#endif
            for (c = 0; c < cols; c++) {
                const ad_real *src = B + (ptrdiff_t)(j0 + p + c) * ldb + k0;
                for (k = 0; k < kc; k++) dst[(size_t)k * nr + c] = src[k];
            }
            for (; c < nr; c++)
                for (k = 0; k < kc; k++) dst[(size_t)k * nr + c] = 0;
        }
    }
}

#if AD__GEMM_BF16
/* x rounded to bfloat16 (>>impl:gemm bfloat16), as its 16 bits; a NaN stays a (quiet) NaN.
   Without a branch, so that packing loops vectorise. */
AD__INLINE uint32_t ad__bf16_bits(float x)
{
    uint32_t u, rounded, quiet;
    memcpy(&u, &x, sizeof u);
    rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    quiet = (u >> 16) | 0x40u;
    return (u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
}

/* x rounded to bfloat16, as the float it stands for. */
AD__INLINE float ad__bf16_round(float x)
{
    uint32_t u = ad__bf16_bits(x) << 16;
    float y;
    memcpy(&y, &u, sizeof y);
    return y;
}

#if AD__X86_DISPATCH
/* Sixteen floats rounded to bfloat16 as ad__bf16_round rounds one (to nearest even, a NaN kept
   a quiet NaN), as floats; v itself unless round is set. */
AD__INLINE AD__ALWAYS_INLINE __attribute__((target("avx512f"))) __m512 ad__bf16_round_avx512(__m512 v, int round)
{
    const __m512i u = _mm512_castps_si512(v), one = _mm512_set1_epi32(1);
    __m512i nearest, quiet;
    if (!round) return v;
    nearest = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                   _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
    nearest = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nearest, quiet);
    return _mm512_castsi512_ps(_mm512_and_si512(nearest, _mm512_set1_epi32((int)0xffff0000u)));
}
#endif
#endif

#if AD__HAS_VECTOR_EXT
/* Products with fewer than four rows of C, such as a recurrent layer's step on one sequence or a
   classifier on one image: too thin for the packed kernels, whose tiles have 6 or 8 rows, and
   read in place. Products with fewer than four columns (a matrix times a vector, a regression's
   one output) are the same products transposed (NAME_few_columns). The few rows of op(A) go
   against all of op(B) at once, so that B, the large operand, is read once:
   - B not transposed (NAME_axpy_rows): the rows of C are sums of B's rows scaled by values of
     op(A), vectors along N: JV vectors of columns at a time, then one, then single columns;
   - B transposed and A not (NAME_dot_rows): each value of C is a dot product of two rows
     contiguous along K, up to four columns of C at a time so that several sums are in flight.
     A dot product keeps AD__THIN_SUMS running sums, sum l taking every k = l mod AD__THIN_SUMS,
     added up in a fixed order at the end (ad__thin_total); a last part of K is zero-padded to a
     whole step. So the order does not depend on the vector width.
   R is a constant in every caller (1, 2 or 3), so the accumulators stay in registers.
   Each value of A and B goes through ROUND_V (vectors) or ROUND_S (single values) as it is
   read: AD__THIN_AS_IS for products in the tape's precision, the rounding to bfloat16 for a tape
   in AD_MATMUL_BFLOAT16 (ad__thin_bf16_*: the same sums, of the rounded operands; the rounding
   costs about as much as the multiply-adds, where packing such a product costs several times
   more). */
#define AD__THIN_SUMS 16
#define AD__THIN_COPY 256 /* values of k a stretch of B's columns copied to rows (ad__thin_*_dot_copied) */
/* The AD__THIN_SUMS running sums of a thin dot product, added up pairwise in a fixed order: sum l
   and sum l + 8, then l and l + 4, and so on. Each halving is a loop of constant length, which
   the compiler turns into one vector add. */
typedef char ad__thin_sums_are_16[AD__THIN_SUMS == 16 ? 1 : -1];
AD__INLINE ad_real ad__thin_total(const ad_real *sums)
{
    ad_real t[AD__THIN_SUMS];
    int l;
    memcpy(t, sums, sizeof t);
    for (l = 0; l < 8; l++) t[l] += t[l + 8];
    for (l = 0; l < 4; l++) t[l] += t[l + 4];
    for (l = 0; l < 2; l++) t[l] += t[l + 2];
    return t[0] + t[1];
}

#define AD__THIN_AS_IS(x) (x)
#define AD__DEFINE_THIN_KERNELS(NAME, ATTR, VBYTES, JV, ROUND_V, ROUND_S)                        \
    typedef ad_real NAME##_vec __attribute__((vector_size(VBYTES)));                             \
    /* VL values of an operand from p, as the products read them */                              \
    static ATTR AD__ALWAYS_INLINE AD__INLINE_KEYWORD NAME##_vec NAME##_load(const ad_real *p)     \
    {                                                                                            \
        NAME##_vec v;                                                                            \
        memcpy(&v, p, VBYTES);                                                                   \
        return ROUND_V(v);                                                                       \
    }                                                                                            \
    /* Columns j.. (NVEC vectors, or the last cols < VL columns in one) of R rows of C from      \
       op(A) (element (i, k) at A[i * a_row + k * a_k]) and B untransposed, op(B) N columns wide; \
       C's element (i, j) at C[i * c_row + j * c_col] (c_col is 1 but for ad__gemm_thin's         \
       transposed products). The last columns take a whole vector of each row of B, the values   \
       past them B's next ones (lanes never stored), but in the last rows, where the vector would \
       run past B: a copy there, padded with zeros. So each value of C gets the same operations   \
       as in a whole vector. */                                                                  \
    static ATTR AD__ALWAYS_INLINE AD__INLINE_KEYWORD void NAME##_axpy_block(                      \
        const int R, const int NVEC, int j, int cols, int K, const ad_real *AD__RESTRICT A,       \
        ptrdiff_t a_row, ptrdiff_t a_k, const ad_real *AD__RESTRICT B, ptrdiff_t ldb,            \
        ad_real *AD__RESTRICT C, ptrdiff_t c_row, ptrdiff_t c_col, int accumulate)               \
    {                                                                                            \
        enum { VL = (int)(VBYTES / sizeof(ad_real)) };                                           \
        const int part = cols < NVEC * VL;                                                       \
        /* the first row whose whole vector, VL - cols values past its last column, would run    \
           past B's last value */                                                                \
        const int k_in = part ? K - (ldb > 0 ? (int)((VL - cols + ldb - 1) / ldb) : K) : K;      \
        NAME##_vec c[3][JV], zero;                                                               \
        ad_real lanes[VL], pad[VL];                                                              \
        int i, k, v, l;                                                                          \
        memset(&zero, 0, sizeof zero);                                                           \
        memset(pad, 0, sizeof pad);                                                              \
        _Pragma("GCC unroll 4") for (i = 0; i < R; i++)                                          \
        _Pragma("GCC unroll 4") for (v = 0; v < NVEC; v++) c[i][v] = zero;                       \
        for (k = 0; k < K; k++) {                                                                \
            NAME##_vec b[JV];                                                                    \
            if (part && k >= k_in) {                                                             \
                for (l = 0; l < cols; l++) pad[l] = B[(ptrdiff_t)k * ldb + j + l];               \
                b[0] = NAME##_load(pad);                                                         \
            } else {                                                                             \
                _Pragma("GCC unroll 4") for (v = 0; v < NVEC; v++)                               \
                    b[v] = NAME##_load(B + (ptrdiff_t)k * ldb + j + v * VL);                     \
            }                                                                                    \
            _Pragma("GCC unroll 4") for (i = 0; i < R; i++) {                                    \
                NAME##_vec a = ROUND_S(A[i * a_row + k * a_k]) - zero;                           \
                _Pragma("GCC unroll 4") for (v = 0; v < NVEC; v++) c[i][v] += a * b[v];          \
            }                                                                                    \
        }                                                                                        \
        _Pragma("GCC unroll 4") for (i = 0; i < R; i++)                                          \
        _Pragma("GCC unroll 4") for (v = 0; v < NVEC; v++) {                                     \
            ad_real *dst = C + i * c_row + (j + v * VL) * c_col;                                 \
            NAME##_vec old;                                                                      \
            if (c_col != 1 || part) { /* a row of C^T (a column of C), or the last columns */    \
                memcpy(lanes, &c[i][v], VBYTES);                                                 \
                for (l = 0; l < (part ? cols : VL); l++)                                         \
                    dst[l * c_col] = accumulate ? dst[l * c_col] + lanes[l] : lanes[l];          \
                continue;                                                                        \
            }                                                                                    \
            if (accumulate) {                                                                    \
                memcpy(&old, dst, VBYTES);                                                       \
                c[i][v] += old;                                                                  \
            }                                                                                    \
            memcpy(dst, &c[i][v], VBYTES);                                                       \
        }                                                                                        \
    }                                                                                            \
    static ATTR AD__ALWAYS_INLINE AD__INLINE_KEYWORD void NAME##_axpy_rows(                       \
        const int R, int ta, int N, int K, const ad_real *AD__RESTRICT A, ptrdiff_t lda,          \
        const ad_real *AD__RESTRICT B, ptrdiff_t ldb, ad_real *AD__RESTRICT C, ptrdiff_t c_row,   \
        ptrdiff_t c_col, int accumulate)                                                         \
    {                                                                                            \
        enum { VL = (int)(VBYTES / sizeof(ad_real)) };                                           \
        const ptrdiff_t a_row = ta ? 1 : lda, a_k = ta ? lda : 1;                               \
        int j = 0;                                                                               \
        for (; j + JV * VL <= N; j += JV * VL)                                                   \
            NAME##_axpy_block(R, JV, j, JV * VL, K, A, a_row, a_k, B, ldb, C, c_row, c_col, accumulate); \
        for (; j + VL <= N; j += VL)                                                             \
            NAME##_axpy_block(R, 1, j, VL, K, A, a_row, a_k, B, ldb, C, c_row, c_col, accumulate); \
        if (j < N)                                                                               \
            NAME##_axpy_block(R, 1, j, N - j, K, A, a_row, a_k, B, ldb, C, c_row, c_col, accumulate); \
    }                                                                                            \
    /* One step of AD__THIN_SUMS values from k on: the running sums s of R rows (a[i]) against JB \
       rows of B (b[c]) */                                                                       \
    static ATTR AD__ALWAYS_INLINE AD__INLINE_KEYWORD void NAME##_dot_step(                        \
        const int R, const int JB, const ad_real *const *a, const ad_real *const *b, int k,       \
        NAME##_vec (*s)[3][AD__THIN_SUMS / (VBYTES / sizeof(ad_real))])                          \
    {                                                                                            \
        enum { VL = (int)(VBYTES / sizeof(ad_real)), NV = AD__THIN_SUMS / VL };                  \
        NAME##_vec bv[4][NV];                                                                    \
        int i, v, c;                                                                             \
        _Pragma("GCC unroll 4") for (c = 0; c < JB; c++)                                         \
        _Pragma("GCC unroll 16") for (v = 0; v < NV; v++) bv[c][v] = NAME##_load(b[c] + k + v * VL); \
        _Pragma("GCC unroll 4") for (i = 0; i < R; i++)                                          \
        _Pragma("GCC unroll 16") for (v = 0; v < NV; v++) {                                      \
            NAME##_vec av = NAME##_load(a[i] + k + v * VL);                                      \
            _Pragma("GCC unroll 4") for (c = 0; c < JB; c++) s[c][i][v] += av * bv[c][v];        \
        }                                                                                        \
    }                                                                                            \
    static ATTR AD__ALWAYS_INLINE AD__INLINE_KEYWORD void NAME##_dot_rows(                        \
        const int R, int N, int K, const ad_real *AD__RESTRICT A, ptrdiff_t lda,                 \
        const ad_real *AD__RESTRICT B, ptrdiff_t ldb, ad_real *AD__RESTRICT C, ptrdiff_t c_row,   \
        ptrdiff_t c_col, int accumulate)                                                         \
    {                                                                                            \
        enum { VL = (int)(VBYTES / sizeof(ad_real)), NV = AD__THIN_SUMS / VL,                    \
               JB = NV >= 4 ? 1 : 4 / NV };                                                      \
        int i, j, k, v, b;                                                                       \
        NAME##_vec zero;                                                                         \
        memset(&zero, 0, sizeof zero);                                                           \
        for (j = 0; j < N; j += JB) {                                                            \
            int cols = N - j < JB ? N - j : JB;                                                  \
            const ad_real *ap[3], *bp[JB];                                                       \
            ad_real pa[3][AD__THIN_SUMS], pb[JB][AD__THIN_SUMS], lanes[AD__THIN_SUMS];           \
            NAME##_vec s[JB][3][NV];                                                             \
            _Pragma("GCC unroll 4") for (b = 0; b < JB; b++)                                     \
            _Pragma("GCC unroll 4") for (i = 0; i < R; i++)                                      \
            _Pragma("GCC unroll 16") for (v = 0; v < NV; v++) s[b][i][v] = zero;                 \
            _Pragma("GCC unroll 4") for (i = 0; i < R; i++) ap[i] = A + i * lda;                 \
            /* a short last group repeats a column, which is not stored */                       \
            _Pragma("GCC unroll 4") for (b = 0; b < JB; b++) bp[b] = B + (ptrdiff_t)(j + (b < cols ? b : 0)) * ldb; \
            for (k = 0; k + AD__THIN_SUMS <= K; k += AD__THIN_SUMS) NAME##_dot_step(R, JB, ap, bp, k, s); \
            if (k < K) { /* the last part of K, zero-padded to a whole step */                   \
                memset(pa, 0, sizeof pa);                                                        \
                memset(pb, 0, sizeof pb);                                                        \
                for (i = 0; i < R; i++) {                                                        \
                    memcpy(pa[i], ap[i] + k, (size_t)(K - k) * sizeof(ad_real));                 \
                    ap[i] = pa[i];                                                               \
                }                                                                                \
                for (b = 0; b < JB; b++) {                                                       \
                    memcpy(pb[b], bp[b] + k, (size_t)(K - k) * sizeof(ad_real));                 \
                    bp[b] = pb[b];                                                               \
                }                                                                                \
                NAME##_dot_step(R, JB, ap, bp, 0, s);                                            \
            }                                                                                    \
            for (b = 0; b < cols; b++)                                                           \
                for (i = 0; i < R; i++) {                                                        \
                    ad_real *dst = C + i * c_row + (j + b) * c_col;                              \
                    for (v = 0; v < NV; v++) memcpy(lanes + v * VL, &s[b][i][v], VBYTES);        \
                    *dst = accumulate ? *dst + ad__thin_total(lanes) : ad__thin_total(lanes);   \
                }                                                                                \
        }                                                                                        \
    }                                                                                            \
    /* C (+)= op(A) op(B) for M = 1, 2 or 3, the operands not both transposed */                \
    static ATTR AD__UNUSED void NAME(int ta, int tb, int M, int N, int K, const ad_real *A,        \
                                     ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb, ad_real *C,  \
                                     ptrdiff_t ldc, int accumulate)                              \
    {                                                                                            \
        if (tb && M == 1) NAME##_dot_rows(1, N, K, A, lda, B, ldb, C, ldc, 1, accumulate);       \
        else if (tb && M == 2) NAME##_dot_rows(2, N, K, A, lda, B, ldb, C, ldc, 1, accumulate);  \
        else if (tb) NAME##_dot_rows(3, N, K, A, lda, B, ldb, C, ldc, 1, accumulate);            \
        else if (M == 1) NAME##_axpy_rows(1, ta, N, K, A, lda, B, ldb, C, ldc, 1, accumulate);   \
        else if (M == 2) NAME##_axpy_rows(2, ta, N, K, A, lda, B, ldb, C, ldc, 1, accumulate);   \
        else NAME##_axpy_rows(3, ta, N, K, A, lda, B, ldb, C, ldc, 1, accumulate);               \
    }                                                                                            \
    /* R rows of C^T = B^T A^T (C^T's element (j, i) at C[i * ldc + j]): B's R columns copied  \
       to rows AD__THIN_COPY values of k at a time, each stretch's dot products added to C */    \
    static ATTR AD__ALWAYS_INLINE AD__INLINE_KEYWORD void NAME##_dot_copied(                      \
        const int R, int M, int K, const ad_real *AD__RESTRICT A, ptrdiff_t lda,                 \
        const ad_real *AD__RESTRICT B, ptrdiff_t ldb, ad_real *AD__RESTRICT C, ptrdiff_t ldc,     \
        int accumulate)                                                                          \
    {                                                                                            \
        ad_real rows[3][AD__THIN_COPY];                                                          \
        int k0, k, j;                                                                            \
        for (k0 = 0; k0 < K; k0 += AD__THIN_COPY) {                                              \
            int kc = K - k0 < AD__THIN_COPY ? K - k0 : AD__THIN_COPY;                            \
            for (k = 0; k < kc; k++)                                                             \
                _Pragma("GCC unroll 4") for (j = 0; j < R; j++) rows[j][k] = B[(ptrdiff_t)(k0 + k) * ldb + j]; \
            NAME##_dot_rows(R, M, kc, rows[0], AD__THIN_COPY, A + k0, lda, C, 1, ldc, accumulate || k0 > 0); \
        }                                                                                        \
    }                                                                                            \
    /* C (+)= op(A) op(B) for N = 1, 2 or 3 (and M from 4 on), any transposes, as the transposed \
       product C^T = op(B)^T op(A)^T of N rows: op(B)^T is B itself where B is transposed, and \
       its rows read along B's columns where it is not; op(A)^T is A read along its rows (dot   \
       products) where A is not transposed, A's rows scaled and added where it is. With neither \
       transposed B's columns are copied to rows first, but for one column of adjacent values. */ \
    static ATTR AD__UNUSED void NAME##_few_columns(int ta, int tb, int M, int N, int K,           \
                                                   const ad_real *A, ptrdiff_t lda,              \
                                                   const ad_real *B, ptrdiff_t ldb, ad_real *C,  \
                                                   ptrdiff_t ldc, int accumulate)                \
    {                                                                                            \
        if (!ta && !tb && N == 1 && ldb == 1) NAME##_dot_rows(1, M, K, B, K, A, lda, C, 1, ldc, accumulate); \
        else if (!ta && !tb && N == 1) NAME##_dot_copied(1, M, K, A, lda, B, ldb, C, ldc, accumulate); \
        else if (!ta && !tb && N == 2) NAME##_dot_copied(2, M, K, A, lda, B, ldb, C, ldc, accumulate); \
        else if (!ta && !tb) NAME##_dot_copied(3, M, K, A, lda, B, ldb, C, ldc, accumulate);     \
        else if (!ta && N == 1) NAME##_dot_rows(1, M, K, B, ldb, A, lda, C, 1, ldc, accumulate); \
        else if (!ta && N == 2) NAME##_dot_rows(2, M, K, B, ldb, A, lda, C, 1, ldc, accumulate); \
        else if (!ta) NAME##_dot_rows(3, M, K, B, ldb, A, lda, C, 1, ldc, accumulate);          \
        else if (N == 1) NAME##_axpy_rows(1, !tb, M, K, B, ldb, A, lda, C, 1, ldc, accumulate);  \
        else if (N == 2) NAME##_axpy_rows(2, !tb, M, K, B, ldb, A, lda, C, 1, ldc, accumulate);  \
        else NAME##_axpy_rows(3, !tb, M, K, B, ldb, A, lda, C, 1, ldc, accumulate);              \
    }
AD__DEFINE_THIN_KERNELS(ad__thin_generic, , 16, 3, AD__THIN_AS_IS, AD__THIN_AS_IS)
#if AD__X86_DISPATCH
AD__DEFINE_THIN_KERNELS(ad__thin_avx2, __attribute__((target("avx2,fma"))), 32, 3, AD__THIN_AS_IS, AD__THIN_AS_IS)
AD__DEFINE_THIN_KERNELS(ad__thin_avx512, __attribute__((target("avx512f,avx2,fma"))), 64, 4, AD__THIN_AS_IS,
                        AD__THIN_AS_IS)
#endif
#if AD__GEMM_BF16
/* NAME(v): each float of v rounded to bfloat16 as ad__bf16_round rounds one, in VBYTES vectors. */
#define AD__DEFINE_BF16_VECTOR_ROUND(NAME, ATTR, VBYTES)                                          \
    typedef float NAME##_floats __attribute__((vector_size(VBYTES)));                            \
    typedef uint32_t NAME##_bits __attribute__((vector_size(VBYTES)));                           \
    static ATTR AD__ALWAYS_INLINE AD__INLINE_KEYWORD NAME##_floats NAME(NAME##_floats v)         \
    {                                                                                            \
        NAME##_bits u, nearest, quiet, nan;                                                      \
        memcpy(&u, &v, VBYTES);                                                                  \
        nearest = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;                                \
        quiet = (u & 0xffff0000u) | 0x400000u;                                                   \
        nan = (NAME##_bits)((u & 0x7fffffffu) > 0x7f800000u); /* all ones where a NaN */        \
        u = (nearest & ~nan) | (quiet & nan);                                                    \
        memcpy(&v, &u, VBYTES);                                                                  \
        return v;                                                                                \
    }
AD__DEFINE_BF16_VECTOR_ROUND(ad__bf16_round_v16, , 16)
AD__DEFINE_THIN_KERNELS(ad__thin_bf16_generic, , 16, 3, ad__bf16_round_v16, ad__bf16_round)
#if AD__X86_DISPATCH
AD__DEFINE_BF16_VECTOR_ROUND(ad__bf16_round_v32, __attribute__((target("avx2,fma"))), 32)
AD__DEFINE_THIN_KERNELS(ad__thin_bf16_avx2, __attribute__((target("avx2,fma"))), 32, 3, ad__bf16_round_v32,
                        ad__bf16_round)
typedef float ad__bf16_round_v64_floats __attribute__((vector_size(64)));
AD__INLINE AD__ALWAYS_INLINE __attribute__((target("avx512f"))) ad__bf16_round_v64_floats
ad__bf16_round_v64(ad__bf16_round_v64_floats v)
{
    return ad__bf16_round_avx512(v, 1); /* its mask registers: a third faster than vector code */
}
AD__DEFINE_THIN_KERNELS(ad__thin_bf16_avx512, __attribute__((target("avx512f,avx2,fma"))), 64, 4,
                        ad__bf16_round_v64, ad__bf16_round)
#endif
#undef AD__DEFINE_BF16_VECTOR_ROUND
#endif
#undef AD__DEFINE_THIN_KERNELS
#endif

/* Whether the thin kernels (above) take a product: one to three rows of C with the operands not
   both transposed (ad__thin_rows), or one to three columns of C and more rows, any transposes
   (ad__few_columns: a matrix times a vector); and a compiler with vector types. */
AD__INLINE int ad__thin_rows(int ta, int tb, int M) { return AD__HAS_VECTOR_EXT && M >= 1 && M < 4 && !(ta && tb); }
AD__INLINE int ad__few_columns(int M, int N) { return AD__HAS_VECTOR_EXT && M >= 4 && N >= 1 && N < 4; }

/* The thin kernels at the machine's widest vectors: for few rows of C, or for few columns
   (few_columns set, then any number of rows); on the operands rounded to bfloat16 where bf16 is
   set. */
#if AD__GEMM_BF16
#define AD__THIN_PICK(ISA)                                                                        \
    (bf16 ? (few_columns ? ad__thin_bf16_##ISA##_few_columns : ad__thin_bf16_##ISA)               \
          : (few_columns ? ad__thin_##ISA##_few_columns : ad__thin_##ISA))
#else
#define AD__THIN_PICK(ISA) ((void)bf16, few_columns ? ad__thin_##ISA##_few_columns : ad__thin_##ISA)
#endif
AD__PRIVATE void ad__thin_run(int bf16, int few_columns, int ta, int tb, int M, int N, int K, const ad_real *A,
                              ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc,
                              int accumulate)
{
#if AD__X86_DISPATCH
    if (ad__isa() == AD__ISA_AVX512) {
        AD__THIN_PICK(avx512)(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
        return;
    }
    if (ad__isa() == AD__ISA_AVX2) {
        AD__THIN_PICK(avx2)(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
        return;
    }
#endif
#if AD__HAS_VECTOR_EXT
    AD__THIN_PICK(generic)(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
#else
    (void)bf16, (void)few_columns, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B;
    (void)ldb, (void)C, (void)ldc, (void)accumulate;
#endif
}
#undef AD__THIN_PICK

/* A product the thin kernels take, done by them (on operands rounded to bfloat16 where bf16 is
   set); returns 0 for the others, which are left to plain loops or packed. */
AD__PRIVATE int ad__gemm_thin(int bf16, int ta, int tb, int M, int N, int K, const ad_real *A, ptrdiff_t lda,
                              const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int accumulate)
{
    int few_columns = ad__few_columns(M, N);
    if (!few_columns && !ad__thin_rows(ta, tb, M)) return 0;
    ad__thin_run(bf16, few_columns, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return 1;
}

/* Small products: plain loops, no packing, but for thin ones (ad__gemm_thin). */
AD__PRIVATE void ad__gemm_small(int ta, int tb, int M, int N, int K, const ad_real *A, ptrdiff_t lda,
                                const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int accumulate)
{
    int i, j, k;
    if (ad__gemm_thin(0, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate)) return;
    for (i = 0; i < M; i++) {
        ad_real *c = C + (ptrdiff_t)i * ldc;
        if (!accumulate)
            for (j = 0; j < N; j++) c[j] = 0;
        for (k = 0; k < K; k++) {
            ad_real a = ta ? A[(ptrdiff_t)k * lda + i] : A[(ptrdiff_t)i * lda + k];
            if (!tb) {
                const ad_real *b = B + (ptrdiff_t)k * ldb;
                for (j = 0; j < N; j++) c[j] += a * b[j];
            } else {
                for (j = 0; j < N; j++) c[j] += a * B[(ptrdiff_t)j * ldb + k];
            }
        }
    }
}

/* The product with a column kernel: op(A) transposed, so its columns are contiguous, B not
   transposed and at most the kernel's width of columns; B's values end at b_end. B is read in
   place when it has exactly that width, else packed; of A only the rows of a last, partial tile
   are packed. */
AD__PRIVATE void ad__gemm_columns(ad__gemm_kernel ker, ad_real *pa, ad_real *pb, int M, int N, int K, int kstep,
                                  const ad_real *A, ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb,
                                  const ad_real *b_end, ad_real *C, ptrdiff_t ldc, int accumulate)
{
    int pc, i, height = ker.column_height, in_place = N == ker.column_width;
    ptrdiff_t b_step = in_place ? ldb : ker.column_width;
    for (pc = 0; pc < K; pc += kstep) {
        int kc = K - pc < kstep ? K - pc : kstep, acc = accumulate || pc > 0;
        const ad_real *bp = in_place ? B + (ptrdiff_t)pc * ldb : pb;
        if (!in_place) ad__pack_b(0, B, ldb, b_end, pc, kc, 0, N, ker.column_width, pb);
        for (i = 0; i < M; i += height) {
            int rows = M - i < height ? M - i : height;
            ad_real *c = C + (ptrdiff_t)i * ldc;
            if (rows == height) {
                ker.columns(kc, A + (ptrdiff_t)pc * lda + i, lda, bp, b_step, c, ldc, rows, N, acc);
            } else {
                ad__pack_a(1, A, lda, i, rows, pc, kc, height, pa);
                ker.columns(kc, pa, height, bp, b_step, c, ldc, rows, N, acc);
            }
        }
    }
}

/* The product with the spread kernel (ad__spread_kernel): neither operand transposed, nine or
   ten columns; B packed a K block at a time. */
AD__PRIVATE void ad__gemm_spread(ad_real *pb, int M, int N, int K, int kstep, const ad_real *A,
                                 ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc,
                                 int accumulate)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    int pc, i;
    for (pc = 0; pc < K; pc += kstep) {
        int kc = K - pc < kstep ? K - pc : kstep, acc = accumulate || pc > 0;
        ad__pack_spread_b(B, ldb, pc, kc, N, pb);
        for (i = 0; i < M; i += AD__SPREAD_ROWS) {
            int rows = M - i < AD__SPREAD_ROWS ? M - i : AD__SPREAD_ROWS;
            ad__spread_kernel(kc, A + (ptrdiff_t)i * lda + pc, lda, pb, C + (ptrdiff_t)i * ldc, ldc, rows, N, acc);
        }
    }
#else
    (void)pb, (void)M, (void)N, (void)K, (void)kstep, (void)A, (void)lda, (void)B, (void)ldb;
    (void)C, (void)ldc, (void)accumulate;
#endif
}

/* The product with a narrow kernel: B not transposed and at most the kernel's width of columns,
   its values ending at b_end. B is read in place but for its last rows, those whose whole vector
   would run past b_end, which are packed; of A only the rows of a last, partial tile are packed. */
AD__PRIVATE void ad__gemm_narrow(ad__gemm_kernel ker, ad_real *pa, ad_real *pb, int ta, int M, int N, int K,
                                 int kstep, const ad_real *A, ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb,
                                 const ad_real *b_end, ad_real *C, ptrdiff_t ldc, int accumulate)
{
    int pc, i, height = ker.narrow_height, width = ker.narrow_width;
    for (pc = 0; pc < K; pc += kstep) {
        int kc = K - pc < kstep ? K - pc : kstep, acc = accumulate || pc > 0, k_in = 0;
        const ad_real *b = B + (ptrdiff_t)pc * ldb;
        if (b_end - b >= width) {
            ptrdiff_t whole = (b_end - b - width) / ldb + 1; /* rows with a whole vector before b_end */
            k_in = whole < kc ? (int)whole : kc;
        }
        if (k_in < kc) ad__pack_b(0, B, ldb, b_end, pc + k_in, kc - k_in, 0, N, width, pb);
        for (i = 0; i < M; i += height) {
            int rows = M - i < height ? M - i : height;
            const ad_real *a = ta ? A + (ptrdiff_t)pc * lda + i : A + (ptrdiff_t)i * lda + pc;
            ptrdiff_t a_row = ta ? 1 : lda, a_k = ta ? lda : 1;
            if (rows < height) {
                ad__pack_a(ta, A, lda, i, rows, pc, kc, height, pa);
                a = pa;
                a_row = 1;
                a_k = height;
            }
            ker.narrow(kc, a, a_row, a_k, b, ldb, k_in, pb, C + (ptrdiff_t)i * ldc, ldc, rows, N, acc);
        }
    }
}

/* The product for one block of C with one thread's packing buffers pa (AD__MC x AD__KC_MAX) and
   pb (AD__KC_MAX x AD__NC). Packing pays off when a panel is used many times. When op(A) has few
   rows, each element of B is used only a few times: the micro-kernel then reads B's rows in place
   (when B is not transposed). When op(B) has at most four panels of columns, each element of A is
   used at most four times: the micro-kernel reads A in place, since packing it would cost
   about as much as the reads it saves. Only a last, partial panel is packed then. Either operand
   is packed after all when its rows would crowd a few sets of L1 (ad__gemm_pack_strided).
   Products with few columns and B not transposed go to a column kernel (op(A) transposed), the
   spread kernel (nine or ten columns) or a narrow one, which waste no lanes, or fewer, on
   columns C does not have. */
/* The block of C at rows ic..ic+mc-1, columns jc..jc+nc-1, from columns pc..pc+kc-1 of op(A) and
   the same rows of op(B): register tiles in columns of the B panel, rows of the A panel. The first
   a_full rows of the block are read from A in place, the rest from the packed panel pa; the first
   b_full columns from B in place, the rest from the packed panel pb. */
AD__PRIVATE void ad__gemm_block(ad__gemm_kernel ker, const ad_real *pa, const ad_real *pb, int ta, const ad_real *A,
                                ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb, int ic, int mc, int jc, int nc,
                                int pc, int kc, int a_full, int b_full, ad_real *C, ptrdiff_t ldc, int acc)
{
    int jr, ir;
    for (jr = 0; jr < nc; jr += ker.nr) {
        int nr = nc - jr < ker.nr ? nc - jr : ker.nr;
        const ad_real *bp = jr < b_full ? B + (ptrdiff_t)pc * ldb + jc + jr : pb + (size_t)(jr - b_full) * kc;
        ptrdiff_t bstride = jr < b_full ? ldb : ker.nr;
        for (ir = 0; ir < mc; ir += ker.mr) {
            int mr = mc - ir < ker.mr ? mc - ir : ker.mr, in_place = ir < a_full;
            ad__microkernel fn = in_place ? ker.fn_strided : ker.fn;
            const ad_real *ap;
            ptrdiff_t a_row = 1, a_k = ker.mr;
            ad_real *c = C + (ptrdiff_t)(ic + ir) * ldc + jc + jr;
            if (in_place) {
                ap = ta ? A + (ptrdiff_t)pc * lda + ic + ir : A + (ptrdiff_t)(ic + ir) * lda + pc;
                a_row = ta ? 1 : lda;
                a_k = ta ? lda : 1;
            } else {
                ap = pa + (size_t)(ir - a_full) * kc;
            }
            fn(kc, ap, a_row, a_k, bp, bstride, c, ldc, mr, nr, acc);
        }
    }
}

/* How many of L1's 64 sets (64-byte lines, 4 KiB a way, on Intel's cores and on Zen 4 alike)
   the starts of rows ld values apart fall into: all of them, unless the stride in bytes is a
   multiple of a power of two above 64. */
AD__INLINE int ad__l1_sets_of_stride(ptrdiff_t ld)
{
    size_t bytes = (size_t)ld * sizeof(ad_real), way = 4096;
    while (bytes % way) way >>= 1;
    return way <= 64 ? 64 : (int)(4096 / way);
}

/* Whether an operand that the micro-kernels would read in place, kc rows ld values apart, is
   better packed: when its panel is read again by at least min_reuse register tiles (reuse) and
   its rows crowd into too few L1 sets to stay there until then (more than four rows a set: L1
   has 8 ways on Zen 3 and 4, 12 on Intel's cores, and the other operand and C need room too).
   Four tiles for a transposed A, and for B with AVX-512's kernels (8 x 32): the weight
   gradient x^T g of a GPT's layer, 128 x 512 from K = 768, runs 1.2x faster packed; with few
   tiles, as in a small convolution's products, reading in place stays the faster. Eight for B
   with AVX2's (6 x 16, ker.pack_b_reuse): on a Zen 3, the LSTM's g . W (32 x 256 from
   K = 1024, six tiles) runs faster in place. */
AD__INLINE int ad__gemm_pack_strided(ptrdiff_t ld, int kc, int reuse, int min_reuse)
{
    return reuse >= min_reuse && kc > 4 * ad__l1_sets_of_stride(ld);
}

/* Rows of a block of C whose A rows are read in place rather than packed: all whole register
   tiles when op(B) has at most four panels of columns, so each element of A is used at most
   four times and packing would not pay; none otherwise, or when a transposed A's rows crowd L1
   (ad__gemm_pack_strided). */
AD__INLINE int ad__gemm_a_in_place(ad__gemm_kernel ker, int ta, ptrdiff_t lda, int mc, int nc, int kc)
{
    if (!ker.fn_strided || nc > 4 * ker.nr) return 0;
    if (ta && ad__gemm_pack_strided(lda, kc, (nc + ker.nr - 1) / ker.nr, 4)) return 0;
    return mc / ker.mr * ker.mr;
}

/* One past the last value of B, whose op(B) is K x N with rows (tb 0) or columns (tb 1) ldb apart:
   packing must not read beyond it. */
AD__INLINE const ad_real *ad__gemm_b_end(int tb, const ad_real *B, ptrdiff_t ldb, int N, int K)
{
    return tb ? B + (ptrdiff_t)(N - 1) * ldb + K : B + (ptrdiff_t)(K - 1) * ldb + N;
}

/* An op(B) packed once for many products with it (a recurrent layer's w_hh^T, read at every
   step): for each block of ad__gemm_kstep rows, the panels of all its columns, padded to a
   multiple of nr, as ad__pack_b lays them out; the block of rows pc starts at data + pc * width.
   A product with it reads its columns from col0 on. Made by ad__gemm_prepack_bt, not for
   bfloat16 products, which pack their own pair panels. */
typedef struct ad__packed_b {
    const ad_real *data;     /* NULL: not packed, the products pack B themselves */
    size_t width;            /* op(B)'s columns rounded up to nr */
    int nr, col0;
    int N, K;                /* op(B)'s shape, which a product with it must have */
} ad__packed_b;

/* The packed block of columns jc.. (of the product's own) and rows pc.. of op(B) in pk. */
AD__INLINE const ad_real *ad__packed_block(const ad__packed_b *pk, int jc, int pc, int kc)
{
    return pk->data + (size_t)pc * pk->width + (size_t)(pk->col0 + jc) * kc;
}

/* The product on one thread, from op(B) packed in pk when pk is not NULL, else packing it
   block by block into pb. */
AD__PRIVATE void ad__gemm_serial(ad__gemm_kernel ker, ad_real *pa, ad_real *pb, int ta, int tb, int M, int N,
                                 int K, int kstep, const ad_real *A, ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb,
                                 ad_real *C, ptrdiff_t ldc, int accumulate, const ad__packed_b *pk)
{
    int jc, pc, ic,
        b_direct = !pk && !tb && M <= AD__MC &&
                   !ad__gemm_pack_strided(ldb, kstep, (M + ker.mr - 1) / ker.mr, ker.pack_b_reuse);
    const ad_real *b_end = ad__gemm_b_end(tb, B, ldb, N, K);
    if (ta && !tb && N <= ker.column_width && ker.columns) {
        /* the column kernel's tile pads a last tile of few rows, here up to 24 of its 32, to its
           height: the narrow kernel's tiles of 8 rows waste less, with the same sums */
        int tail = M % ker.column_height, whole = M - tail;
        if (tail > ker.column_height - ker.narrow_height || N > ker.narrow_width || !ker.narrow) whole = M, tail = 0;
        if (whole) ad__gemm_columns(ker, pa, pb, whole, N, K, kstep, A, lda, B, ldb, b_end, C, ldc, accumulate);
        if (tail)
            ad__gemm_narrow(ker, pa, pb, 1, tail, N, K, kstep, A + whole, lda, B, ldb, b_end, C + (ptrdiff_t)whole * ldc,
                            ldc, accumulate);
        return;
    }
    if (!ta && !tb && N > 8 && N <= 10 && ker.spread) {
        ad__gemm_spread(pb, M, N, K, kstep, A, lda, B, ldb, C, ldc, accumulate);
        return;
    }
    if (!tb && N <= ker.narrow_width && ker.narrow) {
        ad__gemm_narrow(ker, pa, pb, ta, M, N, K, kstep, A, lda, B, ldb, b_end, C, ldc, accumulate);
        return;
    }
    for (jc = 0; jc < N; jc += AD__NC) {
        int nc = N - jc < AD__NC ? N - jc : AD__NC;
        int b_full = b_direct ? nc / ker.nr * ker.nr : 0; /* columns read in place */
        for (pc = 0; pc < K; pc += kstep) {
            int kc = K - pc < kstep ? K - pc : kstep;
            int acc = accumulate || pc > 0;
            const ad_real *bp = pk ? ad__packed_block(pk, jc, pc, kc) : pb;
            if (!pk && b_full < nc) ad__pack_b(tb, B, ldb, b_end, pc, kc, jc + b_full, nc - b_full, ker.nr, pb);
            for (ic = 0; ic < M; ic += AD__MC) {
                int mc = M - ic < AD__MC ? M - ic : AD__MC, a_full = ad__gemm_a_in_place(ker, ta, lda, mc, nc, kc);
                if (a_full < mc) ad__pack_a(ta, A, lda, ic + a_full, mc - a_full, pc, kc, ker.mr, pa);
                ad__gemm_block(ker, pa, bp, ta, A, lda, B, ldb, ic, mc, jc, nc, pc, kc, a_full, b_full, C, ldc, acc);
            }
        }
    }
}

/* >>impl:gemm bfloat16 ------------------------------------------------------------------------
   A tape in AD_MATMUL_BFLOAT16 rounds both operands of its products to bfloat16 (float's sign,
   exponent and top 7 mantissa bits, rounded to nearest even) as it packs them, and accumulates
   in float; products with one to three rows or columns of C are not packed but go to the thin
   kernels, which round each value as they read it. A panel holds neighbouring values of k in
   pairs, one 32-bit unit each, k in the lower half and k + 1 in the upper: the layout of the
   bfloat16 dot-product instructions, which multiply two such pairs lane by lane and add both
   products to a float. B's panel of nr columns is its pair rows one after the other, nr units
   each. A's panel of mr rows is either the same with mr units per pair row, or, for AMX's
   tiles, row after row; the pairs are padded with zeros to the kernel's multiple (an odd kc's
   last pair included).
   Three kinds of kernel, by what the processor has:
   - AMX (Intel's tile registers, with Linux's leave to use them, asked for when a tape is set to
     bfloat16): 32 x 32 of C from four 16 x 16 tiles, 16 pairs of k per tile product;
   - AVX512-BF16's vector dot product (AMD's cores; Intel's cores with AMX run it at a fraction
     of an FMA's rate, so AMX comes first);
   - elsewhere the float micro-kernel, on panels of floats already rounded to bfloat16, each
     pair's two values in the order the dot-product instruction adds them
     (ad__pack_*_bf16_floats): the same rounding of the operands, near float products' speed.
   K is blocked as ad__gemm blocks it, so every element of C is the same sequence of operations
   whatever the split over threads. */
#if AD__GEMM_BF16
/* The pair unit of k (lo) and k + 1 (hi). */
AD__INLINE uint32_t ad__bf16_pair(float lo, float hi) { return ad__bf16_bits(lo) | ad__bf16_bits(hi) << 16; }

/* The pairs of kc values of k, padded to a multiple of block. */
AD__INLINE int ad__bf16_pairs(int kc, int block) { return ((kc + 1) / 2 + block - 1) / block * block; }

/* The packing routines, defined once and compiled twice: for any processor, and with AVX-512's
   registers, where their loops are vectorised four times as wide.
   ad__pack_b_bf16: rows k0..k0+kc-1, columns j0..j0+nc-1 of op(B) into pair panels of nr
   columns, of pp pair rows each (zeros beyond the values).
   ad__pack_a_bf16: rows i0..i0+mc-1, columns k0..k0+kc-1 of op(A) into panels of mr rows and pp
   pairs (zeros beyond the values): pair row after pair row, or with by_rows row after row. */
#define AD__DEFINE_BF16_PACK(SUFFIX, ATTR)                                                         \
    static ATTR AD__UNUSED void ad__pack_b_bf16##SUFFIX(int tb, const float *B, ptrdiff_t ldb, int k0, int kc, \
                                                        int j0, int nc, int nr, int pp,             \
                                                        uint32_t *AD__RESTRICT dst)                 \
    {                                                                                              \
        int pairs = (kc + 1) / 2, p, c, kk;                                                        \
        for (p = 0; p < nc; p += nr, dst += (size_t)nr * pp) {                                     \
            int cols = nc - p < nr ? nc - p : nr;                                                  \
            if (!tb) {                                                                             \
                for (kk = 0; kk < pairs; kk++) {                                                   \
                    const float *lo = B + (ptrdiff_t)(k0 + 2 * kk) * ldb + j0 + p, *hi = lo + ldb; \
                    uint32_t *d = dst + (size_t)kk * nr;                                           \
                    if (2 * kk + 1 < kc)                                                           \
                        for (c = 0; c < cols; c++) d[c] = ad__bf16_pair(lo[c], hi[c]);             \
                    else                                                                           \
                        for (c = 0; c < cols; c++) d[c] = ad__bf16_bits(lo[c]);                    \
                    for (; c < nr; c++) d[c] = 0;                                                  \
                }                                                                                  \
            } else {                                                                               \
                for (c = 0; c < cols; c++) {                                                       \
                    const float *s = B + (ptrdiff_t)(j0 + p + c) * ldb + k0;                       \
                    for (kk = 0; 2 * kk + 1 < kc; kk++)                                            \
                        dst[(size_t)kk * nr + c] = ad__bf16_pair(s[2 * kk], s[2 * kk + 1]);        \
                    if (kc & 1) dst[(size_t)kk * nr + c] = ad__bf16_bits(s[2 * kk]);               \
                }                                                                                  \
                for (kk = 0; kk < pairs; kk++)                                                     \
                    for (c = cols; c < nr; c++) dst[(size_t)kk * nr + c] = 0;                      \
            }                                                                                      \
            memset(dst + (size_t)pairs * nr, 0, (size_t)(pp - pairs) * nr * sizeof *dst);          \
        }                                                                                          \
    }                                                                                              \
    static ATTR AD__UNUSED void ad__pack_a_bf16##SUFFIX(int ta, const float *A, ptrdiff_t lda, int i0, int mc, \
                                                        int k0, int kc, int mr, int pp, int by_rows, \
                                                        uint32_t *AD__RESTRICT dst)                 \
    {                                                                                              \
        int pairs = (kc + 1) / 2, p, r, kk;                                                        \
        /* unit (r, kk) at r r_step + kk k_step */                                                 \
        ptrdiff_t r_step = by_rows ? pp : 1, k_step = by_rows ? 1 : mr;                            \
        for (p = 0; p < mc; p += mr, dst += (size_t)mr * pp) {                                     \
            int rows = mc - p < mr ? mc - p : mr;                                                  \
            if (!ta) {                                                                             \
                for (r = 0; r < rows; r++) {                                                       \
                    const float *s = A + (ptrdiff_t)(i0 + p + r) * lda + k0;                       \
                    uint32_t *d = dst + r * r_step;                                                \
                    for (kk = 0; 2 * kk + 1 < kc; kk++) d[kk * k_step] = ad__bf16_pair(s[2 * kk], s[2 * kk + 1]); \
                    if (kc & 1) d[kk * k_step] = ad__bf16_bits(s[2 * kk]);                         \
                }                                                                                  \
            } else {                                                                               \
                /* a panel's rows side by side (r_step 1) are stored as vectors, not unit by unit */ \
                for (kk = 0; kk < pairs; kk++) {                                                   \
                    const float *lo = A + (ptrdiff_t)(k0 + 2 * kk) * lda + i0 + p, *hi = lo + lda; \
                    uint32_t *d = dst + kk * k_step;                                               \
                    if (2 * kk + 1 < kc && !by_rows)                                               \
                        for (r = 0; r < rows; r++) d[r] = ad__bf16_pair(lo[r], hi[r]);             \
                    else if (2 * kk + 1 < kc)                                                      \
                        for (r = 0; r < rows; r++) d[r * r_step] = ad__bf16_pair(lo[r], hi[r]);    \
                    else                                                                           \
                        for (r = 0; r < rows; r++) d[r * r_step] = ad__bf16_bits(lo[r]);           \
                }                                                                                  \
            }                                                                                      \
            for (r = 0; r < mr; r++)                                                               \
                for (kk = r < rows ? pairs : 0; kk < pp; kk++) dst[r * r_step + kk * k_step] = 0;  \
        }                                                                                          \
    }
AD__DEFINE_BF16_PACK(, )
#if AD__X86_DISPATCH
AD__DEFINE_BF16_PACK(_avx512, __attribute__((target("avx512f,avx512bw,avx2,fma"))))
#endif
#undef AD__DEFINE_BF16_PACK

/* Panels of floats for a float micro-kernel, where the processor has no bfloat16 instruction:
   packed as float products pack them (ad__pack_a, ad__pack_b), then each value rounded to
   bfloat16 and the two of each pair of k swapped, value k to row k ^ 1, so that the kernel adds
   each pair's products in the dot-product instruction's order, k + 1's first. An odd kc's last
   value goes to row kc, after a row of zeros: a panel has kc rounded up to even rows (at most
   ad__gemm_kc_limit(), which is even).
   ad__bf16_round_pairs: that rounding and swap, in place, of a panel of kc rows of n values. */
#define AD__DEFINE_BF16_ROUND_PAIRS(SUFFIX, ATTR)                                                  \
    static ATTR AD__ALWAYS_INLINE AD__INLINE_KEYWORD void ad__bf16_round_pair##SUFFIX(float *AD__RESTRICT lo, \
                                                                            float *AD__RESTRICT hi, int n) \
    {                                                                                              \
        int c;                                                                                     \
        for (c = 0; c < n; c++) {                                                                  \
            float k_value = ad__bf16_round(lo[c]);                                                 \
            lo[c] = ad__bf16_round(hi[c]);                                                         \
            hi[c] = k_value;                                                                       \
        }                                                                                          \
    }                                                                                              \
    static ATTR AD__UNUSED void ad__bf16_round_pairs##SUFFIX(float *panel, int kc, int n)         \
    {                                                                                              \
        int kk, c;                                                                                 \
        /* six, the AVX2 kernel's rows, as a constant: a loop the compiler vectorises */           \
        if (n == 6)                                                                                \
            for (kk = 0; 2 * kk + 1 < kc; kk++)                                                    \
                ad__bf16_round_pair##SUFFIX(panel + (size_t)2 * kk * 6, panel + (size_t)(2 * kk + 1) * 6, 6); \
        else                                                                                       \
            for (kk = 0; 2 * kk + 1 < kc; kk++)                                                    \
                ad__bf16_round_pair##SUFFIX(panel + (size_t)2 * kk * n, panel + (size_t)(2 * kk + 1) * n, n); \
        if (kc & 1) {                                                                              \
            float *AD__RESTRICT last = panel + (size_t)(kc - 1) * n, *AD__RESTRICT after = last + n; \
            for (c = 0; c < n; c++) {                                                              \
                after[c] = ad__bf16_round(last[c]);                                                \
                last[c] = 0;                                                                       \
            }                                                                                      \
        }                                                                                          \
    }
AD__DEFINE_BF16_ROUND_PAIRS(_generic, )
#if AD__X86_DISPATCH
AD__DEFINE_BF16_ROUND_PAIRS(_avx2, __attribute__((target("avx2"))))
#endif
#undef AD__DEFINE_BF16_ROUND_PAIRS

AD__PRIVATE void ad__bf16_round_pairs(float *panel, int kc, int n)
{
#if AD__X86_DISPATCH
    if (ad__isa() >= AD__ISA_AVX2) {
        ad__bf16_round_pairs_avx2(panel, kc, n);
        return;
    }
#endif
    ad__bf16_round_pairs_generic(panel, kc, n);
}

/* Rows k0..k0+kc-1, columns j0..j0+nc-1 of op(B) (whose values end at b_end) into panels of nr
   columns, of rounded floats in swapped pairs. */
AD__PRIVATE void ad__pack_b_bf16_floats(int tb, const float *B, ptrdiff_t ldb, const float *b_end, int k0, int kc,
                                        int j0, int nc, int nr, float *dst)
{
    int rows = (kc + 1) & ~1, p;
    for (p = 0; p < nc; p += nr, dst += (size_t)nr * rows) {
        ad__pack_b(tb, B, ldb, b_end, k0, kc, j0 + p, nc - p < nr ? nc - p : nr, nr, dst);
        ad__bf16_round_pairs(dst, kc, nr);
    }
}

/* Rows i0..i0+mc-1, columns k0..k0+kc-1 of op(A) into panels of mr rows, of rounded floats in
   swapped pairs. */
AD__PRIVATE void ad__pack_a_bf16_floats(int ta, const float *A, ptrdiff_t lda, int i0, int mc, int k0, int kc,
                                        int mr, float *dst)
{
    int rows = (kc + 1) & ~1, p;
    for (p = 0; p < mc; p += mr, dst += (size_t)mr * rows) {
        ad__pack_a(ta, A, lda, i0 + p, mc - p < mr ? mc - p : mr, k0, kc, mr, dst);
        ad__bf16_round_pairs(dst, kc, mr);
    }
}

/* A bfloat16 micro-kernel: the first rows x cols of C (row stride ldc) from pp pairs of k, an A
   panel and a B panel as its ad__bf16_gemm_kernel describes them; added to C when accumulate. */
typedef void (*ad__bf16_kernel)(int pp, const uint32_t *A, const uint32_t *B, float *C, ptrdiff_t ldc, int rows,
                                int cols, int accumulate);

/* A kernel that computes a whole block of C from its A and B panels (mc x nc, pp pairs). */
typedef void (*ad__bf16_block_kernel)(int pp, const uint32_t *apan, const uint32_t *bpan, float *C, ptrdiff_t ldc,
                                      int mc, int nc, int accumulate);

typedef struct ad__bf16_gemm_kernel {
    ad__bf16_kernel fn;          /* one mr x nr tile from pair panels, or NULL */
    ad__bf16_block_kernel block;
    ad__microkernel floats;      /* a float kernel on panels of rounded floats, where neither is set */
    int mr, nr;
    int a_by_rows;   /* A panels row after row (AMX's tiles), else pair row after pair row */
    int pair_block;  /* the pairs of a panel are a multiple of this */
} ad__bf16_gemm_kernel;

/* C's first rows x cols from a tile of floats, nc a row: stored, or added to what is there. */
AD__INLINE void ad__bf16_store(float *C, ptrdiff_t ldc, const float *tile, int nc, int rows, int cols,
                               int accumulate)
{
    int i, j;
    for (i = 0; i < rows; i++) {
        float *c = C + i * ldc;
        const float *t = tile + (size_t)i * nc;
        if (accumulate)
            for (j = 0; j < cols; j++) c[j] += t[j];
        else
            for (j = 0; j < cols; j++) c[j] = t[j];
    }
}

#if AD__HAS_VECTOR_EXT
/* The kernel's tile, MR rows of NV float vectors (VBYTES each), stored to C: a whole tile a
   vector at a time, an edge tile through ad__bf16_store. */
#define AD__BF16_STORE_TILE(VEC, VBYTES, VL, MR, NV)                                             \
    if (rows == MR && cols == NV * VL) {                                                         \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++)                                        \
        _Pragma("GCC unroll 16") for (j = 0; j < NV; j++) {                                      \
            VEC old;                                                                             \
            if (accumulate) {                                                                    \
                memcpy(&old, C + i * ldc + j * VL, VBYTES);                                      \
                c[i][j] += old;                                                                  \
            }                                                                                    \
            memcpy(C + i * ldc + j * VL, &c[i][j], VBYTES);                                      \
        }                                                                                        \
    } else {                                                                                     \
        float edge_[MR * NV * VL];                                                               \
        memcpy(edge_, c, sizeof edge_);                                                          \
        ad__bf16_store(C, ldc, edge_, NV * VL, rows, cols, accumulate);                          \
    }
#if AD__HAS_BF16_INSTRUCTION
/* AVX512-BF16: one instruction per pair row and vector, MR rows by NV vectors of 16 columns:
   8 by 2, and 16 by 1 for products of at most 16 columns, where the wider tile would leave half
   its lanes idle or more. Every element of C gets the same operations in either. */
#define AD__DEFINE_BF16_DOT(NAME, MR, NV)                                                         \
    static __attribute__((target("avx512f,avx512bf16,avx2,fma"))) AD__CODE_ALIGN AD__UNUSED void \
    NAME(int pp, const uint32_t *AD__RESTRICT A, const uint32_t *AD__RESTRICT B, float *C,       \
         ptrdiff_t ldc, int rows, int cols, int accumulate)                                       \
    {                                                                                            \
        typedef float vec __attribute__((vector_size(64)));                                      \
        typedef int ivec __attribute__((vector_size(64)));                                       \
        enum { VL = 16 };                                                                        \
        vec c[MR][NV], zero;                                                                     \
        int i, j, kk;                                                                            \
        memset(&zero, 0, sizeof zero);                                                           \
        _Pragma("GCC unroll 16") for (i = 0; i < MR; i++)                                        \
        _Pragma("GCC unroll 16") for (j = 0; j < NV; j++) c[i][j] = zero;                        \
        for (kk = 0; kk < pp; kk++) {                                                            \
            ivec b[NV];                                                                          \
            _Pragma("GCC unroll 16") for (j = 0; j < NV; j++)                                    \
                memcpy(&b[j], B + (size_t)kk * NV * VL + j * VL, 64);                            \
            _Pragma("GCC unroll 16") for (i = 0; i < MR; i++) {                                  \
                ivec a;                                                                          \
                memset(&a, 0, sizeof a);                                                         \
                a += (int)A[(size_t)kk * MR + i];                                                \
                _Pragma("GCC unroll 16") for (j = 0; j < NV; j++)                                \
                    c[i][j] = (vec)_mm512_dpbf16_ps((__m512)c[i][j], (__m512bh)a, (__m512bh)b[j]); \
            }                                                                                    \
        }                                                                                        \
        AD__BF16_STORE_TILE(vec, 64, VL, MR, NV)                                                 \
    }
AD__DEFINE_BF16_DOT(ad__bf16_dot_avx512, 8, 2)
AD__DEFINE_BF16_DOT(ad__bf16_dot16_avx512, 16, 1)
#undef AD__DEFINE_BF16_DOT
#endif
#undef AD__BF16_STORE_TILE
#endif /* AD__HAS_VECTOR_EXT */

#if AD__HAS_AMX
/* AMX's tile configuration (palette 1): each tile's rows and bytes per row. */
typedef struct ad__amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} ad__amx_config;

/* AMX: an mc x nc block of C from the A panels (of 32 rows, row after row, pp units each) and
   B panels (of 32 columns) of one K block. Each 32 x 32 part of it is tiles 0-3 (16 x 16 floats
   each), from A's two tiles of 16 rows and B's two tiles of 16 columns (4 and 5, 6 and 7), 16
   pairs of k at a time, from zero: each element of C gets one sum per K block, added to what C
   holds, whatever part of a block it falls in (so whatever the split over threads). A whole
   part that is not added is stored by the tiles themselves, the others go through a tile of
   floats on the stack. The tiles are
   configured once for the block and released at its end, so that the calling thread holds no
   tile state between products. */
static __attribute__((target("amx-tile,amx-bf16,avx512f"))) AD__UNUSED void
ad__bf16_amx_block(int pp, const uint32_t *apan, const uint32_t *bpan, float *C, ptrdiff_t ldc, int mc, int nc,
                   int accumulate)
{
    ad__amx_config cfg;
    float tile[32 * 32];
    int t, kb, ir, jr;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.bytes_per_row[t] = 64;
    }
    _tile_loadconfig(&cfg);
    for (jr = 0; jr < nc; jr += 32) {
        const uint32_t *B = bpan + (size_t)jr * pp;
        for (ir = 0; ir < mc; ir += 32) {
            const uint32_t *A = apan + (size_t)ir * pp;
            float *c = C + (ptrdiff_t)ir * ldc + jr;
            int rows = mc - ir < 32 ? mc - ir : 32, cols = nc - jr < 32 ? nc - jr : 32;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (kb = 0; kb < pp; kb += 16) {
                _tile_loadd(4, A + kb, pp * 4);
                _tile_loadd(5, A + (size_t)16 * pp + kb, pp * 4);
                _tile_loadd(6, B + (size_t)kb * 32, 128);
                _tile_loadd(7, B + (size_t)kb * 32 + 16, 128);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            if (rows == 32 && cols == 32 && !accumulate) {
                _tile_stored(0, c, ldc * 4);
                _tile_stored(1, c + 16, ldc * 4);
                _tile_stored(2, c + 16 * ldc, ldc * 4);
                _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
                continue;
            }
            _tile_stored(0, tile, 128);
            _tile_stored(1, tile + 16, 128);
            _tile_stored(2, tile + 16 * 32, 128);
            _tile_stored(3, tile + 16 * 32 + 16, 128);
            ad__bf16_store(c, ldc, tile, 32, rows, cols, accumulate);
        }
    }
    _tile_release();
}

/* Whether this processor has AMX-BF16 (CPUID leaf 7: AMX-BF16 and AMX-TILE) and Linux grants
   the process the tiles' state (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, a system call
   made directly, so that no feature macro is needed). */
AD__PRIVATE int ad__amx_permitted(void)
{
    unsigned a, b, c, d;
    long rc;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return 0;
    __asm__ __volatile__("syscall" : "=a"(rc) : "a"(158L), "D"(0x1023L), "S"(18L) : "rcx", "r11", "memory");
    return rc == 0;
}
#endif

/* The bfloat16 kernel of the given kind (T->bf16: AD__BF16_AMX where the tiles were granted)
   for an M x N product: the processor's bfloat16 instructions, else float_kernel on panels of
   rounded floats. */
AD__PRIVATE ad__bf16_gemm_kernel ad__bf16_pick(int kind, ad__gemm_kernel float_kernel, int M, int N)
{
    ad__bf16_gemm_kernel k;
    k.fn = NULL;
    k.block = NULL;
    k.floats = NULL;
    k.a_by_rows = 0;
    k.pair_block = 1;
#if AD__HAS_AMX
    if (kind == AD__BF16_AMX) {
        k.block = ad__bf16_amx_block;
        k.mr = 32;
        k.nr = 32;
        k.a_by_rows = 1;
        k.pair_block = 16;
        return k;
    }
#endif
    (void)kind;
    (void)M;
    (void)N;
#if AD__HAS_BF16_INSTRUCTION
    if (ad__isa_features() & AD__ISA_BF16) {
        /* the tall tile for few columns, where it has the rows to fill it */
        int tall = N <= 16 && M >= 16;
        k.fn = tall ? ad__bf16_dot16_avx512 : ad__bf16_dot_avx512;
        k.mr = tall ? 16 : 8;
        k.nr = tall ? 16 : 32;
        return k;
    }
#endif
    k.floats = float_kernel.fn;
    k.mr = float_kernel.mr;
    k.nr = float_kernel.nr;
    return k;
}

/* The bfloat16 product on one thread through a float micro-kernel (ker.floats), in that
   thread's packing buffers pa and pb: blocked as ad__gemm_serial is, with A and B always packed,
   since packing is where they are rounded (ad__pack_*_bf16_floats). The panels' rows, kc
   rounded up to even, fit the buffers because ad__gemm_kc_limit() and AD__KC_MAX are even. */
typedef char ad__kc_is_even[AD__KC_MAX % 2 == 0 ? 1 : -1];
AD__PRIVATE void ad__gemm_serial_bf16_floats(ad__bf16_gemm_kernel ker, float *pa, float *pb, int ta, int tb, int M,
                                             int N, int K, int kstep, const float *A, ptrdiff_t lda, const float *B,
                                             ptrdiff_t ldb, float *C, ptrdiff_t ldc, int accumulate)
{
    const int mc_max = AD__MC / ker.mr * ker.mr;
    const float *b_end = ad__gemm_b_end(tb, B, ldb, N, K);
    int jc, pc, ic, jr, ir;
    for (jc = 0; jc < N; jc += AD__NC) {
        int nc = N - jc < AD__NC ? N - jc : AD__NC;
        for (pc = 0; pc < K; pc += kstep) {
            int kc = K - pc < kstep ? K - pc : kstep, rows = (kc + 1) & ~1;
            int acc = accumulate || pc > 0;
            ad__pack_b_bf16_floats(tb, B, ldb, b_end, pc, kc, jc, nc, ker.nr, pb);
            for (ic = 0; ic < M; ic += mc_max) {
                int mc = M - ic < mc_max ? M - ic : mc_max;
                ad__pack_a_bf16_floats(ta, A, lda, ic, mc, pc, kc, ker.mr, pa);
                for (jr = 0; jr < nc; jr += ker.nr) {
                    int nr = nc - jr < ker.nr ? nc - jr : ker.nr;
                    for (ir = 0; ir < mc; ir += ker.mr) {
                        int mr = mc - ir < ker.mr ? mc - ir : ker.mr;
                        ker.floats(rows, pa + (size_t)ir * rows, 1, ker.mr, pb + (size_t)jr * rows, ker.nr,
                                   C + (ptrdiff_t)(ic + ir) * ldc + jc + jr, ldc, mr, nr, acc);
                    }
                }
            }
        }
    }
}

/* The bfloat16 product on one thread with kernel ker and that thread's packing buffers pa and
   pb (the float buffers of ad__gemm_serial, which the pair panels, half their size, fit in).
   Blocked as ad__gemm_serial is; A and B are always packed, since packing is where they are
   rounded. */
AD__PRIVATE void ad__gemm_serial_bf16(ad__bf16_gemm_kernel ker, ad_real *pa, ad_real *pb, int ta, int tb, int M,
                                      int N, int K, int kstep, const ad_real *A, ptrdiff_t lda, const ad_real *B,
                                      ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int accumulate)
{
    uint32_t *apan = (uint32_t *)(void *)pa, *bpan = (uint32_t *)(void *)pb;
    const int mc_max = AD__MC / ker.mr * ker.mr;
#if AD__X86_DISPATCH
    const int wide = ad__isa() == AD__ISA_AVX512; /* the packing routines with AVX-512 */
#endif
    int jc, pc, ic, jr, ir;
    for (jc = 0; jc < N; jc += AD__NC) {
        int nc = N - jc < AD__NC ? N - jc : AD__NC;
        for (pc = 0; pc < K; pc += kstep) {
            int kc = K - pc < kstep ? K - pc : kstep, pp = ad__bf16_pairs(kc, ker.pair_block);
            int acc = accumulate || pc > 0;
#if AD__X86_DISPATCH
            if (wide) ad__pack_b_bf16_avx512(tb, B, ldb, pc, kc, jc, nc, ker.nr, pp, bpan);
            else
#endif
                ad__pack_b_bf16(tb, B, ldb, pc, kc, jc, nc, ker.nr, pp, bpan);
            for (ic = 0; ic < M; ic += mc_max) {
                int mc = M - ic < mc_max ? M - ic : mc_max;
#if AD__X86_DISPATCH
                if (wide) ad__pack_a_bf16_avx512(ta, A, lda, ic, mc, pc, kc, ker.mr, pp, ker.a_by_rows, apan);
                else
#endif
                    ad__pack_a_bf16(ta, A, lda, ic, mc, pc, kc, ker.mr, pp, ker.a_by_rows, apan);
                if (ker.block) {
                    ker.block(pp, apan, bpan, C + (ptrdiff_t)ic * ldc + jc, ldc, mc, nc, acc);
                    continue;
                }
                for (jr = 0; jr < nc; jr += ker.nr) {
                    int nr = nc - jr < ker.nr ? nc - jr : ker.nr;
                    for (ir = 0; ir < mc; ir += ker.mr) {
                        int mr = mc - ir < ker.mr ? mc - ir : ker.mr;
                        ker.fn(pp, apan + (size_t)ir * pp, bpan + (size_t)jr * pp,
                               C + (ptrdiff_t)(ic + ir) * ldc + jc + jr, ldc, mr, nr, acc);
                    }
                }
            }
        }
    }
}
#endif /* AD__GEMM_BF16 */

/* The product on one thread in the tape's precision. */
AD__PRIVATE void ad__gemm_one_thread(int bf16, ad__gemm_kernel ker, ad_real *pa, ad_real *pb, int ta, int tb, int M,
                                     int N, int K, int kstep, const ad_real *A, ptrdiff_t lda, const ad_real *B,
                                     ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int accumulate, const ad__packed_b *pk)
{
#if AD__GEMM_BF16
    if (bf16) {
        ad__bf16_gemm_kernel bker = ad__bf16_pick(bf16, ker, M, N);
        if (bker.floats)
            ad__gemm_serial_bf16_floats(bker, pa, pb, ta, tb, M, N, K, kstep, A, lda, B, ldb, C, ldc, accumulate);
        else
            ad__gemm_serial_bf16(bker, pa, pb, ta, tb, M, N, K, kstep, A, lda, B, ldb, C, ldc, accumulate);
        return;
    }
#else
    (void)bf16;
#endif
    ad__gemm_serial(ker, pa, pb, ta, tb, M, N, K, kstep, A, lda, B, ldb, C, ldc, accumulate, pk);
}

/* One thread's packing buffers: an A block and a B block with room for a last panel, a whole
   number of 64-byte lines, so that every thread's buffers stay aligned. */
#define AD__PACK_PER_THREAD ((size_t)AD__MC * AD__KC_MAX + (size_t)AD__KC_MAX * (AD__NC + AD__NR_MAX))

/* One stripe of C per task: rows [r0, r1) or columns [c0, c1) of the whole product. */
typedef struct ad__gemm_job {
    ad__gemm_kernel ker;
    int bf16;                /* AD__BF16_*: operands rounded to bfloat16 (>>impl:gemm bfloat16) */
    ad_real *pack;
    int ta, tb, M, N, K, by_rows, stripe;
    int kstep;               /* the product's K block (ad__gemm_kstep) */
    const ad_real *A, *B;
    ptrdiff_t lda, ldb, ldc;
    ad_real *C;
    int accumulate;
    const ad__packed_b *pk;  /* op(B) packed already, or NULL */
} ad__gemm_job;

AD__PRIVATE void ad__gemm_task(void *ctx, int task, int thread)
{
    const ad__gemm_job *j = (const ad__gemm_job *)ctx;
    ad_real *pa = j->pack + (size_t)thread * AD__PACK_PER_THREAD, *pb = pa + (size_t)AD__MC * AD__KC_MAX;
    int lo = task * j->stripe, len;
    ad__packed_b stripe_pk;
    if (j->by_rows) {
        len = j->M - lo < j->stripe ? j->M - lo : j->stripe;
        ad__gemm_one_thread(j->bf16, j->ker, pa, pb, j->ta, j->tb, len, j->N, j->K, j->kstep,
                            j->ta ? j->A + lo : j->A + (ptrdiff_t)lo * j->lda, j->lda, j->B, j->ldb,
                            j->C + (ptrdiff_t)lo * j->ldc, j->ldc, j->accumulate, j->pk);
    } else {
        len = j->N - lo < j->stripe ? j->N - lo : j->stripe;
        if (j->pk) {
            stripe_pk = *j->pk;
            stripe_pk.col0 += lo;
        }
        ad__gemm_one_thread(j->bf16, j->ker, pa, pb, j->ta, j->tb, j->M, len, j->K, j->kstep, j->A, j->lda,
                            j->tb ? j->B + (ptrdiff_t)lo * j->ldb : j->B + lo, j->ldb, j->C + lo, j->ldc,
                            j->accumulate, j->pk ? &stripe_pk : NULL);
    }
}

/* Large products on several threads share one packed block of B instead of each thread packing
   its own: the threads pack its panels together, then take blocks of A's rows one at a time, a
   few per thread, so that a thread slowed by other work on its core takes fewer of them. Every
   element of C goes through the same kernel calls as on one thread. */
typedef struct ad__gemm_shared_job {
    const ad__gemm_job *j;
    ad_real *pb;             /* the packed block of B, the first thread's B buffer */
    const ad_real *block_b;  /* the block the rows read: pb, or the block of j->pk */
    const ad_real *b_end;    /* the end of B's values */
    int jc, nc, pc, kc;      /* the block of op(B) being worked on */
    int panels_per_task;     /* B panels each packing task packs */
    int rows_per_task;       /* rows of C (whole register tiles, at most AD__MC) per block task */
} ad__gemm_shared_job;

/* From AD__SHARE_MACS multiply-adds, products with enough rows share B (in float: the pair
   panels of bfloat16 products are packed by each thread). */
AD__PRIVATE int ad__gemm_shares_b(const ad__gemm_job *j, int threads)
{
    return !j->bf16 && threads > 1 && j->M > AD__MC && j->N > 2 * j->ker.nr && (double)j->M * j->N * j->K >= AD__SHARE_MACS;
}

AD__PRIVATE void ad__gemm_pack_b_task(void *ctx, int task, int thread)
{
    const ad__gemm_shared_job *s = (const ad__gemm_shared_job *)ctx;
    const ad__gemm_job *j = s->j;
    int c0 = task * s->panels_per_task * j->ker.nr, width = s->panels_per_task * j->ker.nr;
    (void)thread;
    if (width > s->nc - c0) width = s->nc - c0;
    if (width > 0)
        ad__pack_b(j->tb, j->B, j->ldb, s->b_end, s->pc, s->kc, s->jc + c0, width, j->ker.nr,
                   s->pb + (size_t)c0 * s->kc);
}

AD__PRIVATE void ad__gemm_rows_task(void *ctx, int task, int thread)
{
    const ad__gemm_shared_job *s = (const ad__gemm_shared_job *)ctx;
    const ad__gemm_job *j = s->j;
    ad_real *pa = j->pack + (size_t)thread * AD__PACK_PER_THREAD;
    int ic = task * s->rows_per_task, mc = j->M - ic < s->rows_per_task ? j->M - ic : s->rows_per_task;
    int a_full = ad__gemm_a_in_place(j->ker, j->ta, j->lda, mc, s->nc, s->kc);
    if (a_full < mc) ad__pack_a(j->ta, j->A, j->lda, ic + a_full, mc - a_full, s->pc, s->kc, j->ker.mr, pa);
    ad__gemm_block(j->ker, pa, s->block_b, j->ta, j->A, j->lda, j->B, j->ldb, ic, mc, s->jc, s->nc, s->pc, s->kc,
                   a_full, 0, j->C, j->ldc, j->accumulate || s->pc > 0);
}

AD__PRIVATE void ad__gemm_shared(ad_tape *T, const ad__gemm_job *j, int threads)
{
    ad__gemm_shared_job s;
    int mr = j->ker.mr, per = (j->M + 4 * threads - 1) / (4 * threads), kstep = j->kstep;
    s.j = j;
    s.pb = j->pack + (size_t)AD__MC * AD__KC_MAX;
    s.b_end = ad__gemm_b_end(j->tb, j->B, j->ldb, j->N, j->K);
    per = (per + mr - 1) / mr * mr;
    s.rows_per_task = per < AD__MC ? per : AD__MC / mr * mr;
    for (s.jc = 0; s.jc < j->N; s.jc += AD__NC) {
        int panels;
        s.nc = j->N - s.jc < AD__NC ? j->N - s.jc : AD__NC;
        panels = (s.nc + j->ker.nr - 1) / j->ker.nr;
        s.panels_per_task = (panels + threads - 1) / threads;
        for (s.pc = 0; s.pc < j->K; s.pc += kstep) {
            s.kc = j->K - s.pc < kstep ? j->K - s.pc : kstep;
            s.block_b = j->pk ? ad__packed_block(j->pk, s.jc, s.pc, s.kc) : s.pb;
            if (!j->pk)
                ad__parallel(T, ad__gemm_pack_b_task, &s, (panels + s.panels_per_task - 1) / s.panels_per_task);
            ad__parallel(T, ad__gemm_rows_task, &s, (j->M + s.rows_per_task - 1) / s.rows_per_task);
        }
    }
}

/* Products of one block of rows (M at most AD__MC) and many columns, such as a GPT layer's
   weight gradient x^T g (128 x 512 from K = 768), on several threads share one packed op(A)
   instead of each thread packing all of it for its stripe of columns: the threads pack A's K
   blocks together, then take runs of B's panels one at a time, a few per thread, each packing
   its own B panels and running them against all of A block by block. Every element of C goes
   through the same kernel calls, in the same order of blocks, as on one thread. */
typedef struct ad__gemm_cols_job {
    const ad__gemm_job *j;
    ad_real *pa;             /* op(A) packed: the block of K from pc on at pa + pc * rows */
    const ad_real *b_end;    /* the end of B's values */
    int kstep, rows;         /* rows: M rounded up to whole register tiles */
    int pack_tasks;          /* tasks packing each K block of A, each a run of its row panels */
    int panels_per_pack;     /* A's panels each packing task packs */
    int cols_per_task;       /* columns of C (whole panels of B) per column task */
    int b_direct;            /* B's whole panels read in place, as ad__gemm_serial reads them */
} ad__gemm_cols_job;

/* From AD__SHARE_MACS multiply-adds, products that the split by stripes of columns would leave
   packing all of op(A) on every thread (in float, without a kernel for few columns). */
AD__PRIVATE int ad__gemm_shares_a(const ad__gemm_job *j, int threads)
{
    if (j->bf16 || threads < 2 || j->M > AD__MC || j->M >= j->N || j->N < 4 * j->ker.nr) return 0;
    if (j->ta && !j->tb && j->N <= j->ker.column_width && j->ker.columns) return 0;
    if (!j->tb && j->N <= j->ker.narrow_width && j->ker.narrow) return 0;
    return (double)j->M * j->N * j->K >= AD__SHARE_MACS;
}

AD__PRIVATE void ad__gemm_pack_a_task(void *ctx, int task, int thread)
{
    const ad__gemm_cols_job *s = (const ad__gemm_cols_job *)ctx;
    const ad__gemm_job *j = s->j;
    int pc = task / s->pack_tasks * s->kstep, kc = j->K - pc < s->kstep ? j->K - pc : s->kstep;
    int i0 = task % s->pack_tasks * s->panels_per_pack * j->ker.mr, mc = s->panels_per_pack * j->ker.mr;
    (void)thread;
    if (mc > j->M - i0) mc = j->M - i0;
    if (mc > 0) ad__pack_a(j->ta, j->A, j->lda, i0, mc, pc, kc, j->ker.mr, s->pa + (size_t)pc * s->rows + (size_t)i0 * kc);
}

AD__PRIVATE void ad__gemm_cols_task(void *ctx, int task, int thread)
{
    const ad__gemm_cols_job *s = (const ad__gemm_cols_job *)ctx;
    const ad__gemm_job *j = s->j;
    ad_real *pb = j->pack + (size_t)thread * AD__PACK_PER_THREAD + (size_t)AD__MC * AD__KC_MAX;
    int jc = task * s->cols_per_task, nc = j->N - jc < s->cols_per_task ? j->N - jc : s->cols_per_task;
    int b_full = s->b_direct ? nc / j->ker.nr * j->ker.nr : 0, pc;
    for (pc = 0; pc < j->K; pc += s->kstep) {
        int kc = j->K - pc < s->kstep ? j->K - pc : s->kstep;
        const ad_real *bp = j->pk ? ad__packed_block(j->pk, jc, pc, kc) : pb;
        if (!j->pk && b_full < nc) ad__pack_b(j->tb, j->B, j->ldb, s->b_end, pc, kc, jc + b_full, nc - b_full, j->ker.nr, pb);
        ad__gemm_block(j->ker, s->pa + (size_t)pc * s->rows, bp, j->ta, j->A, j->lda, j->B, j->ldb, 0, j->M, jc, nc, pc,
                       kc, 0, b_full, j->C, j->ldc, j->accumulate || pc > 0);
    }
}

/* The values ad__gemm_shared_a needs beyond the threads' buffers: op(A) packed whole. */
AD__INLINE size_t ad__gemm_shared_a_values(const ad__gemm_job *j)
{
    return (size_t)((j->M + j->ker.mr - 1) / j->ker.mr * j->ker.mr) * (size_t)j->K;
}

AD__PRIVATE void ad__gemm_shared_a(ad_tape *T, const ad__gemm_job *j, int threads)
{
    ad__gemm_cols_job s;
    int nr = j->ker.nr, row_panels = (j->M + j->ker.mr - 1) / j->ker.mr, panels = (j->N + nr - 1) / nr;
    int per = (panels + 4 * threads - 1) / (4 * threads);
    if (per > AD__NC / nr) per = AD__NC / nr; /* a thread's B buffer holds AD__NC columns */
    s.j = j;
    s.pa = j->pack + AD__PACK_PER_THREAD * (size_t)threads;
    s.b_end = ad__gemm_b_end(j->tb, j->B, j->ldb, j->N, j->K);
    s.kstep = j->kstep;
    s.rows = row_panels * j->ker.mr;
    s.panels_per_pack = (row_panels + threads - 1) / threads;
    s.pack_tasks = (row_panels + s.panels_per_pack - 1) / s.panels_per_pack;
    s.cols_per_task = per * nr;
    s.b_direct = !j->pk && !j->tb &&
                 !ad__gemm_pack_strided(j->ldb, s.kstep, row_panels, j->ker.pack_b_reuse);
    ad__parallel(T, ad__gemm_pack_a_task, &s, s.pack_tasks * ((j->K + s.kstep - 1) / s.kstep));
    ad__parallel(T, ad__gemm_cols_task, &s, (j->N + s.cols_per_task - 1) / s.cols_per_task);
}

/* Products with a small C and a long K, such as the first layer of an MLP (x [64, 784] times W
   [784, 128] or [784, 512]), are split over threads along K: each thread takes a run of K blocks,
   that is a band of W's rows. The band is the one that thread's share of the backward product W's
   gradient (split by rows) and of the optimizer step (ad__param_band) covers, near enough, so W
   and its gradient stay in that thread's cache from one step to the next instead of crossing
   between cores, and C, being small, is cheap to add up. The first run of blocks is added into
   C, every later block into a buffer of its own; adding the buffers to C in block order does
   per element what one thread does, so results stay the same for any thread count. The split
   is taken for a C of at most AD__KSPLIT_MAX_C values and at most AD__KSPLIT_MAX_BLOCKS blocks,
   which bounds the buffers, and at least one block per thread (with fewer, stripes of C keep
   every thread busy). */

typedef struct ad__gemm_ksplit_job {
    const ad__gemm_job *j;
    int kstep, blocks, tasks;
    int first_end;           /* the blocks of task 0, added into C */
    ad_real *part;           /* M x N per later block */
} ad__gemm_ksplit_job;

/* The number of K blocks of j. */
AD__INLINE int ad__gemm_k_blocks(const ad__gemm_job *j)
{
    return j->kstep > 0 ? (j->K + j->kstep - 1) / j->kstep : 0;
}

AD__PRIVATE int ad__gemm_splits_k(const ad__gemm_job *j, int threads)
{
    int blocks = ad__gemm_k_blocks(j);
    if (threads < 2 || blocks < threads || blocks > AD__KSPLIT_MAX_BLOCKS) return 0;
    if ((double)j->M * j->N > AD__KSPLIT_MAX_C) return 0;
    /* the column and narrow kernels serve those shapes better split by rows */
    if (!j->bf16 && j->ta && !j->tb && j->N <= j->ker.column_width && j->ker.columns) return 0;
    if (!j->bf16 && !j->tb && j->N <= j->ker.narrow_width && j->ker.narrow) return 0;
    return 1;
}

/* The first block of task t's run. */
AD__INLINE int ad__ksplit_first(const ad__gemm_ksplit_job *s, int task)
{
    return (int)((long long)task * s->blocks / s->tasks);
}

AD__PRIVATE void ad__gemm_ksplit_task(void *ctx, int task, int thread)
{
    const ad__gemm_ksplit_job *s = (const ad__gemm_ksplit_job *)ctx;
    const ad__gemm_job *j = s->j;
    ad_real *pa = j->pack + (size_t)thread * AD__PACK_PER_THREAD, *pb = pa + (size_t)AD__MC * AD__KC_MAX;
    int b, end = ad__ksplit_first(s, task + 1);
    ad__packed_b block_pk; /* the call below covers one block of K: its packed rows start there */
    for (b = ad__ksplit_first(s, task); b < end; b++) {
        int pc = b * s->kstep, kc = j->K - pc < s->kstep ? j->K - pc : s->kstep;
        const ad_real *a = j->ta ? j->A + (ptrdiff_t)pc * j->lda : j->A + pc;
        const ad_real *bb = j->tb ? j->B + pc : j->B + (ptrdiff_t)pc * j->ldb;
        if (j->pk) {
            block_pk = *j->pk;
            block_pk.data += (size_t)pc * block_pk.width;
        }
        if (task == 0)
            ad__gemm_one_thread(j->bf16, j->ker, pa, pb, j->ta, j->tb, j->M, j->N, kc, kc, a, j->lda, bb, j->ldb,
                                j->C, j->ldc, j->accumulate || b > 0, j->pk ? &block_pk : NULL);
        else
            ad__gemm_one_thread(j->bf16, j->ker, pa, pb, j->ta, j->tb, j->M, j->N, kc, kc, a, j->lda, bb, j->ldb,
                                s->part + (size_t)(b - s->first_end) * j->M * j->N, j->N, 0,
                                j->pk ? &block_pk : NULL);
    }
}

/* The blocks of j and each task's run of them, for `threads` threads; s->part is left to the
   caller (M x N values for each block after task 0's). */
AD__PRIVATE void ad__ksplit_plan(ad__gemm_ksplit_job *s, const ad__gemm_job *j, int threads)
{
    s->j = j;
    s->kstep = j->kstep;
    s->blocks = ad__gemm_k_blocks(j);
    s->tasks = threads < s->blocks ? threads : s->blocks;
    s->first_end = ad__ksplit_first(s, 1);
    s->part = NULL;
}

/* Runs the tasks, then adds the later blocks' products to C in block order. */
AD__PRIVATE void ad__gemm_ksplit(ad_tape *T, const ad__gemm_ksplit_job *s)
{
    const ad__gemm_job *j = s->j;
    size_t cells = (size_t)j->M * j->N;
    int i, b;
    ad__parallel(T, ad__gemm_ksplit_task, (void *)s, s->tasks);
    for (i = 0; i < j->M; i++) {
        ad_real *c = j->C + (ptrdiff_t)i * j->ldc;
        for (b = 0; b < s->blocks - s->first_end; b++) {
            const ad_real *p = s->part + (size_t)b * cells + (size_t)i * j->N;
            int col;
            for (col = 0; col < j->N; col++) c[col] += p[col];
        }
    }
}

/* Whether a float product is too small or too thin to pack: plain loops do it, or the thin
   kernels for fewer than four rows or columns. From 128 multiply-adds on, packing paid: on Zen 4
   products of 4-32 rows and columns and 4-128 values of k ran 1.02x the time of the faster of
   plain loops and packing on average with this bound, 3.2x with 8192. */
AD__INLINE int ad__gemm_is_small(int M, int N, int K)
{
    return (double)M * N * K < 128.0 || M < 4 || N < 4;
}

/* Products too small or too thin to pack (and empty ones): done here, returning 1; 0 otherwise.
   In bfloat16 (bf16 set) only the empty ones and those the thin kernels take, which round the
   operands as they read them: every other product is packed, which rounds it. */
AD__PRIVATE int ad__gemm_unpacked(int bf16, int ta, int tb, int M, int N, int K, const ad_real *A, ptrdiff_t lda,
                                  const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int accumulate)
{
    int i;
    if (M <= 0 || N <= 0) return 1;
    if (K <= 0) {
        if (!accumulate)
            for (i = 0; i < M; i++) memset(C + (ptrdiff_t)i * ldc, 0, (size_t)N * sizeof(ad_real));
        return 1;
    }
    if (!ad__gemm_is_small(M, N, K)) return 0;
    if (bf16) return ad__gemm_thin(1, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    ad__gemm_small(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return 1;
}

/* At least `values` aligned values in *room (*cap long, kept across calls), grown when short;
   what it held is not kept. NULL when memory runs out. */
AD__PRIVATE ad_real *ad__aligned_room(ad_real **room, size_t *cap, size_t values)
{
    size_t need = values + AD__ALIGN;
    if (*cap < need) {
        ad_real *p = (ad_real *)AUTODIFF_REALLOC(*room, need * sizeof(ad_real));
        if (!p) return NULL;
        *room = p;
        *cap = need;
    }
    return (ad_real *)ad__align_up(*room);
}

/* The tape's packing buffers for `threads` threads, AD__PACK_PER_THREAD values each, then
   `extra` values more, aligned; NULL when they cannot be allocated. */
AD__PRIVATE ad_real *ad__gemm_buffers(ad_tape *T, int threads, size_t extra)
{
    return ad__aligned_room(&T->pack, &T->pack_cap, AD__PACK_PER_THREAD * (size_t)threads + extra);
}

/* The product on the calling thread alone, with that thread's packing buffers (from
   ad__gemm_buffers), in bfloat16 when bf16 is set: for work already split over the pool's
   threads, such as the images of a convolution. */
AD__PRIVATE void ad__gemm_alone(int bf16, ad_real *pack, int ta, int tb, int M, int N, int K, const ad_real *A,
                                ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc,
                                int accumulate)
{
    if (ad__gemm_unpacked(bf16, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate)) return;
    ad__gemm_one_thread(bf16, ad__gemm_pick(N), pack, pack + (size_t)AD__MC * AD__KC_MAX, ta, tb, M, N, K,
                        ad__gemm_kstep(M, N, K, tb), A, lda, B, ldb, C, ldc, accumulate, NULL);
}

/* A thin product's columns split over the tape's threads (ad__gemm_thin_split). */
typedef struct ad__thin_job {
    int bf16, few_columns, ta, tb, M, N, K;
    const ad_real *A, *B;
    ptrdiff_t lda, ldb, ldc;
    ad_real *C;
    int accumulate;
} ad__thin_job;

/* Columns of C (rows, for few columns) between a stretch's boundaries: a multiple of every thin
   kernel's block of them, in float and in double (four of AVX-512's vectors, three of AVX2's or
   of the generic 16-byte ones), so that each goes through the same code as in one call over
   all. */
#define AD__THIN_STRETCH 192

/* The columns lo..hi-1 of a thin product's C, or its rows for few columns. */
AD__PRIVATE void ad__thin_stretch(const void *ctx, size_t lo, size_t hi)
{
    const ad__thin_job *j = (const ad__thin_job *)ctx;
    const ptrdiff_t at = (ptrdiff_t)lo;
    if (j->few_columns)
        ad__thin_run(j->bf16, 1, j->ta, j->tb, (int)(hi - lo), j->N, j->K, j->A + (j->ta ? at : at * j->lda), j->lda,
                     j->B, j->ldb, j->C + at * j->ldc, j->ldc, j->accumulate);
    else
        ad__thin_run(j->bf16, 0, j->ta, j->tb, j->M, (int)(hi - lo), j->K, j->A, j->lda,
                     j->B + (j->tb ? at * j->ldb : at), j->ldb, j->C + at, j->ldc, j->accumulate);
}

/* A product the thin kernels take, from AD__THIN_SPLIT_MACS on, its columns (its rows, for few
   columns) split over the tape's threads (on the calling thread alone where there is one, or
   too few for two stretches): each value of C is the same dot product or sum whatever the
   split. Returns 1 when done, 0 where it is not such a product. */
AD__PRIVATE int ad__gemm_thin_split(ad_tape *T, int ta, int tb, int M, int N, int K, const ad_real *A,
                                    ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc,
                                    int accumulate)
{
    ad__thin_job job;
    job.few_columns = ad__few_columns(M, N);
    if ((!job.few_columns && !ad__thin_rows(ta, tb, M)) || (double)M * N * K < AD__THIN_SPLIT_MACS) return 0;
    job.bf16 = T->bf16 != AD__BF16_OFF;
    job.ta = ta; job.tb = tb; job.M = M; job.N = N; job.K = K;
    job.A = A; job.B = B; job.C = C;
    job.lda = lda; job.ldb = ldb; job.ldc = ldc;
    job.accumulate = accumulate;
    ad__parallel_range(T, ad__thin_stretch, &job, (size_t)(job.few_columns ? M : N), 2 * AD__THIN_STRETCH,
                       AD__THIN_STRETCH);
    return 1;
}

/* C (+)= op(A) op(B), reading op(B) from pk where pk is not NULL (made by ad__gemm_prepack_bt
   from this B); the same results as without it. Returns 0, or -1 when the packing buffers cannot be
   allocated. Large products are split into stripes of C, one per thread; each element of C is
   computed by the same sequence of operations whatever the split, so results are identical for
   any thread count. */
AD__PRIVATE int ad__gemm_packed(ad_tape *T, int ta, int tb, int M, int N, int K, const ad_real *A, ptrdiff_t lda,
                                const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int accumulate,
                                const ad__packed_b *pk)
{
    ad__gemm_job job;
    int threads;
    if (ad__gemm_thin_split(T, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate)) return 0;
    if (ad__gemm_unpacked(T->bf16, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate)) return 0;
    job.ker = ad__gemm_pick(N);
    job.bf16 = T->bf16;
    AUTODIFF_ASSERT(!pk || !pk->data || (tb && pk->N == N && pk->K == K));
    /* pk is ignored where its panels are not this product's: another kernel's width, or float
       panels for a tape now in bfloat16 */
    job.pk = pk && pk->data && pk->nr == job.ker.nr && !job.bf16 ? pk : NULL;
    threads = (double)M * N * K >= AD__SPLIT_MACS ? ad__thread_count(T) : 1;
    job.ta = ta; job.tb = tb; job.M = M; job.N = N; job.K = K;
    job.kstep = ad__gemm_kstep(M, N, K, tb);
    job.A = A; job.B = B; job.C = C;
    job.lda = lda; job.ldb = ldb; job.ldc = ldc;
    job.accumulate = accumulate;
    if (ad__gemm_splits_k(&job, threads)) {
        ad__gemm_ksplit_job s;
        ad__ksplit_plan(&s, &job, threads);
        job.pack = ad__gemm_buffers(T, threads, (size_t)(s.blocks - s.first_end) * M * N);
        if (!job.pack) return -1;
        s.part = job.pack + AD__PACK_PER_THREAD * (size_t)threads;
        ad__gemm_ksplit(T, &s);
        return 0;
    }
    if (ad__gemm_shares_a(&job, threads)) {
        job.pack = ad__gemm_buffers(T, threads, ad__gemm_shared_a_values(&job));
        if (!job.pack) return -1;
        ad__gemm_shared_a(T, &job, threads);
        return 0;
    }
    job.pack = ad__gemm_buffers(T, threads, 0);
    if (!job.pack) return -1;
    if (ad__gemm_shares_b(&job, threads)) {
        ad__gemm_shared(T, &job, threads);
        return 0;
    }
    /* split along the longer side of C, in whole register tiles */
    job.by_rows = M >= N;
    {
        int unit = job.by_rows ? job.ker.mr : job.ker.nr, len = job.by_rows ? M : N;
        int tiles = (len + unit - 1) / unit, per = (tiles + threads - 1) / threads;
        job.stripe = per * unit;
        ad__parallel(T, ad__gemm_task, &job, (len + job.stripe - 1) / job.stripe);
    }
    return 0;
}

/* ad__gemm_packed for a B that is packed as the product goes. */
AD__PRIVATE int ad__gemm(ad_tape *T, int ta, int tb, int M, int N, int K, const ad_real *A, ptrdiff_t lda,
                         const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int accumulate)
{
    return ad__gemm_packed(T, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate, NULL);
}

/* Values of a packed transposed op(B) of K x N for the kernel ad__gemm_pick(N) chooses, rounded
   up to whole 64-byte lines so that packings placed one after another stay aligned. */
AD__PRIVATE size_t ad__packed_bt_values(int N, int K)
{
    size_t nr = (size_t)ad__gemm_pick(N).nr;
    return ad__whole_lines(((size_t)N + nr - 1) / nr * nr * (size_t)K);
}

/* Room on T for packed operands (ad__gemm_prepack_bt): aligned, grown as needed and kept across
   resets, as the packing buffers are, so that a loop of calls allocates nothing after its first.
   Its contents last until the next call asks for room. NULL when memory runs out. */
AD__PRIVATE ad_real *ad__panels_room(ad_tape *T, size_t values)
{
    return ad__aligned_room(&T->panels, &T->panels_cap, values);
}

/* A transposed op(B) (K x N, from B as ad__gemm reads it) packed once into dst (aligned, with
   ad__packed_bt_values(N, K) values), described by pk, for products that read it many times.
   A transposed B is packed by every product (an untransposed one is often read in place). With
   dst NULL, or on a tape in bfloat16, pk->data is NULL and the products pack B themselves; the
   results are the same either way. */
AD__PRIVATE void ad__gemm_prepack_bt(const ad_tape *T, int N, int K, const ad_real *B, ptrdiff_t ldb, ad_real *dst,
                                     ad__packed_b *pk)
{
    ad__gemm_kernel ker = ad__gemm_pick(N);
    const int kstep = ad__gemm_kstep(0, N, K, 1); /* B transposed: M does not matter */
    const ad_real *b_end;
    int pc;
    pk->data = NULL;
    pk->nr = ker.nr;
    pk->col0 = 0;
    pk->N = N;
    pk->K = K;
    pk->width = ((size_t)N + (size_t)ker.nr - 1) / (size_t)ker.nr * (size_t)ker.nr;
    if (!dst || T->bf16 || N <= 0 || K <= 0) return;
    b_end = ad__gemm_b_end(1, B, ldb, N, K);
    for (pc = 0; pc < K; pc += kstep)
        ad__pack_b(1, B, ldb, b_end, pc, K - pc < kstep ? K - pc : kstep, 0, N, ker.nr, dst + (size_t)pc * pk->width);
    pk->data = dst;
}

/* >>ops:elementwise -------------------------------------------------------------------------- */
/* Unary functions: one row each, and nothing else to write to add one (but its public function
   and a row in tests/test_ops.c).
       ID       the kind, AD__U_<ID>
       NAME     the public function, for errors
       SPLIT    LIGHT (a compare or a multiply a value) or HEAVY (a series or a library call):
                from how many values its loops are split over threads (AD__SPLIT_*)
       FORWARD  y from the value x and the parameters p0, p1, as an expression
       DERIV    dy/dx in the small language of AD__X, AD__Y, AD__P0, AD__P1, AD__C(v), AD__ADD,
                AD__SUB, AD__MUL, AD__DIV, AD__NEG, AD__EXP, AD__SIN, AD__COS, AD__ERF,
                AD__SIGM, AD__POW(a, e), AD__STEP (1 where the argument is > 0, else 0),
                AD__SIGN, AD__INSIDE (1 where p0 <= argument <= p1) and AD__SEL(a, b, c) (b
                where a > 0, else c). It is expanded twice: on values, inside the fused loop of
                a plain backward sweep (ad__unary_grad_range), and on tensors with the library's
                ops, for sweeps that record (ad__unary_backward), so higher derivatives come from
                the same formula. STEP, SIGN and INSIDE are constants there: no gradient flows
                through them.
   exp, log, sigmoid, tanh, sin and cos of floats also have vector versions below; the rest of
   the forward and every fused derivative is the row's expression in a plain loop, which the
   compiler vectorises where the expression allows. */
#define AD__INV_SQRT2 0.70710678118654752440
#define AD__INV_SQRT_2PI 0.39894228040143267794
#define AD__TWO_INV_SQRT_PI 1.12837916709551257390

/* The derivative language of the unary and binary rows, each word defined once with its meaning
   on values (AD__DSL_MODE VALUE: the fused loops, where xv[i], av[i], bv[i], yv[i], g[i], p0
   and p1 are in scope) beside its meaning on tensors (AD__DSL_MODE TENSOR: the recorded
   derivative, where T, x, a, b, y, g, p0 and p1 are). The code that expands the rows defines
   AD__DSL_MODE around them. */
#define AD__DSL(value, tensor) AD__DSL_PICK(AD__DSL_MODE, value, tensor)
#define AD__DSL_PICK(mode, value, tensor) AD__DSL_PICK_(mode, value, tensor)
#define AD__DSL_PICK_(mode, value, tensor) AD__DSL_##mode(value, tensor)
#define AD__DSL_VALUE(value, tensor) value
#define AD__DSL_TENSOR(value, tensor) tensor
#define AD__DSL_PASSES(value, tensor) 0 /* >>ops:binary: is a formula the gradient alone? */
#define AD__X AD__DSL(xv[i], x)
#define AD__Y AD__DSL(yv[i], y)
#define AD__A AD__DSL(av[i], a)                      /* >>ops:binary: the operands */
#define AD__B AD__DSL(bv[i], b)
#define AD__G AD__DSL_G(AD__DSL_MODE)                /* >>ops:binary: the incoming gradient */
#define AD__DSL_G(mode) AD__DSL_G_(mode)
#define AD__DSL_G_(mode) AD__DSL_G_##mode
#define AD__DSL_G_VALUE g[i]
#define AD__DSL_G_TENSOR g
#define AD__DSL_G_PASSES 1
#define AD__P0 AD__DSL(p0, ad_scalar(T, p0))
#define AD__P1 AD__DSL(p1, ad_scalar(T, p1))
#define AD__C(v) AD__DSL(((ad_real)(v)), ad_scalar(T, (ad_real)(v)))
#define AD__ADD(a, b) AD__DSL(((a) + (b)), ad_add(T, a, b))
#define AD__SUB(a, b) AD__DSL(((a) - (b)), ad_sub(T, a, b))
#define AD__MUL(a, b) AD__DSL(((a) * (b)), ad_mul(T, a, b))
#define AD__DIV(a, b) AD__DSL(((a) / (b)), ad_div(T, a, b))
#define AD__NEG(a) AD__DSL((-(a)), ad_neg(T, a))
#define AD__EXP(a) AD__DSL(AD__F(exp)(a), ad_exp(T, a))
#define AD__SIN(a) AD__DSL(AD__F(sin)(a), ad_sin(T, a))
#define AD__COS(a) AD__DSL(AD__F(cos)(a), ad_cos(T, a))
#define AD__ERF(a) AD__DSL(AD__F(erf)(a), ad_erf(T, a))
#define AD__SIGM(a) AD__DSL(ad__sigmoid1(a), ad_sigmoid(T, a))
#define AD__POW(a, e) AD__DSL(AD__F(pow)(a, e), ad_pow(T, a, (ad_real)(e)))
/* constants on tensors: no gradient flows through them */
#define AD__STEP(a) AD__DSL(((a) > 0 ? (ad_real)1 : (ad_real)0), ad__mask(T, a, AD__MASK_STEP, p0, p1))
#define AD__SIGN(a) \
    AD__DSL(((a) > 0 ? (ad_real)1 : ((a) < 0 ? (ad_real)-1 : (ad_real)0)), ad__mask(T, a, AD__MASK_SIGN, p0, p1))
#define AD__INSIDE(a) \
    AD__DSL(((a) >= p0 && (a) <= p1 ? (ad_real)1 : (ad_real)0), ad__mask(T, a, AD__MASK_INSIDE, p0, p1))
#define AD__SEL(a, b, c) AD__DSL(((a) > 0 ? (b) : (c)), ad__select_positive(T, a, b, c))
/* >>ops:binary: a power with a tensor exponent, log a taken as 0 where a is 0, and the constant
   shares of maximum and minimum (1 where a > b, 0.5 where a == b, else 0; and the reverse) */
#define AD__POWT(a, e) AD__DSL(AD__F(pow)(a, e), ad_pow_tensor(T, a, e))
#define AD__NONZERO_LOG(a) \
    AD__DSL(((a) != 0 ? AD__F(log)(a) : (ad_real)0), ad_log(T, ad_add(T, a, ad__mask(T, a, AD__MASK_ZERO, 0, 0))))
#define AD__SHARE_GT(a, b) AD__DSL(ad__binary_op(AD__B_GT_MASK, a, b), ad__binary(T, a, b, AD__B_GT_MASK, 0))
#define AD__SHARE_LT(a, b) AD__DSL(ad__binary_op(AD__B_LT_MASK, a, b), ad__binary(T, a, b, AD__B_LT_MASK, 0))

#define AD__UNARY_OPS(X)                                                                                   \
    X(NEG, "ad_neg", LIGHT, -x, AD__NEG(AD__C(1)))                                                         \
    X(EXP, "ad_exp", HEAVY, AD__F(exp)(x), AD__Y)                                                          \
    X(LOG, "ad_log", HEAVY, AD__F(log)(x), AD__DIV(AD__C(1), AD__X))                                       \
    X(SIN, "ad_sin", HEAVY, AD__F(sin)(x), AD__COS(AD__X))                                                 \
    X(COS, "ad_cos", HEAVY, AD__F(cos)(x), AD__NEG(AD__SIN(AD__X)))                                        \
    X(TANH, "ad_tanh", HEAVY, AD__F(tanh)(x), AD__SUB(AD__C(1), AD__MUL(AD__Y, AD__Y)))                    \
    X(SIGMOID, "ad_sigmoid", HEAVY, ad__sigmoid1(x), AD__MUL(AD__Y, AD__SUB(AD__C(1), AD__Y)))             \
    X(RELU, "ad_relu", LIGHT, x > 0 ? x : 0, AD__STEP(AD__X))                                              \
    X(LEAKY_RELU, "ad_leaky_relu", LIGHT, x > 0 ? x : p0 * x, AD__SEL(AD__X, AD__C(1), AD__P0))           \
    X(GELU, "ad_gelu", HEAVY, (ad_real)0.5 * x * (1 + AD__F(erf)(x * (ad_real)AD__INV_SQRT2)),            \
      AD__ADD(AD__MUL(AD__C(0.5), AD__ADD(AD__C(1), AD__ERF(AD__MUL(AD__X, AD__C(AD__INV_SQRT2))))),       \
              AD__MUL(AD__X, AD__MUL(AD__C(AD__INV_SQRT_2PI),                                              \
                                     AD__EXP(AD__MUL(AD__C(-0.5), AD__MUL(AD__X, AD__X)))))))              \
    X(SQRT, "ad_sqrt", HEAVY, AD__F(sqrt)(x), AD__DIV(AD__C(0.5), AD__Y))                                  \
    X(ABS, "ad_abs", LIGHT, AD__F(fabs)(x), AD__SIGN(AD__X))                                               \
    X(SQUARE, "ad_square", LIGHT, x * x, AD__MUL(AD__C(2), AD__X))                                         \
    X(POW, "ad_pow", HEAVY, AD__F(pow)(x, p0), AD__MUL(AD__P0, AD__POW(AD__X, p0 - 1)))                    \
    X(CLAMP, "ad_clamp", LIGHT, x < p0 ? p0 : (x > p1 ? p1 : x), AD__INSIDE(AD__X))                        \
    X(AFFINE, "ad_affine", LIGHT, p0 * x + p1, AD__P0)                                                     \
    X(LOG1P, "ad_log1p", HEAVY, AD__F(log1p)(x), AD__DIV(AD__C(1), AD__ADD(AD__C(1), AD__X)))              \
    X(EXPM1, "ad_expm1", HEAVY, AD__F(expm1)(x), AD__ADD(AD__Y, AD__C(1)))                                 \
    X(SOFTPLUS, "ad_softplus", HEAVY, ad__softplus1(x), AD__SIGM(AD__X))                                   \
    X(SILU, "ad_silu", HEAVY, x * ad__sigmoid1(x),                                                         \
      AD__MUL(AD__SIGM(AD__X), AD__ADD(AD__C(1), AD__MUL(AD__X, AD__SUB(AD__C(1), AD__SIGM(AD__X))))))     \
    X(ERF, "ad_erf", HEAVY, AD__F(erf)(x),                                                                 \
      AD__MUL(AD__C(AD__TWO_INV_SQRT_PI), AD__EXP(AD__NEG(AD__MUL(AD__X, AD__X)))))                        \
    X(ATAN, "ad_atan", HEAVY, AD__F(atan)(x), AD__DIV(AD__C(1), AD__ADD(AD__C(1), AD__MUL(AD__X, AD__X)))) \
    X(RECIPROCAL, "ad_reciprocal", LIGHT, 1 / x, AD__NEG(AD__MUL(AD__Y, AD__Y)))                           \
    X(RSQRT, "ad_rsqrt", HEAVY, 1 / AD__F(sqrt)(x), AD__MUL(AD__C(-0.5), AD__MUL(AD__Y, AD__MUL(AD__Y, AD__Y)))) \
    X(ELU, "ad_elu", HEAVY, x > 0 ? x : p0 * AD__F(expm1)(x), AD__SEL(AD__X, AD__C(1), AD__ADD(AD__Y, AD__P0)))

#define AD__UNARY_ENUM(ID, NAME, SPLIT, FORWARD, DERIV) AD__U_##ID,
enum ad__unary_kind { AD__UNARY_OPS(AD__UNARY_ENUM) AD__U_COUNT };
/* A function the vector code computes beyond the table's forwards: GELU's derivative. */
enum { AD__VM_GELU_GRAD = AD__U_COUNT };
#undef AD__UNARY_ENUM
#define AD__UNARY_NAME(ID, NAME, SPLIT, FORWARD, DERIV) NAME,
static const char *const ad__unary_names[] = {AD__UNARY_OPS(AD__UNARY_NAME) ""};
#undef AD__UNARY_NAME

/* 1 / (1 + e^-x), and log(1 + e^x), written so that exp never overflows */
AD__INLINE ad_real ad__sigmoid1(ad_real x)
{
    ad_real e = AD__F(exp)(-AD__F(fabs)(x));
    return x >= 0 ? 1 / (1 + e) : e / (1 + e);
}

AD__INLINE ad_real ad__softplus1(ad_real x)
{
    return (x > 0 ? x : 0) + AD__F(log1p)(AD__F(exp)(-AD__F(fabs)(x)));
}

#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
/* exp, log, sigmoid, tanh, sin, cos, erf and GELU (and GELU's derivative) of floats on whole
   vectors: the C library computes one value per call and cannot use the vector units.
   Instantiated for AVX-512 and AVX2 and chosen at run time; the double build and other
   machines keep the C library's functions.
   exp: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is nearly exact), e^r from its
   Taylor series to r^7 (the remainder is below 2e-9 of it), times 2^n so that results down to
   the smallest subnormal and up to overflow round once: with AVX-512's scaling instruction,
   with AVX2 in two factors built in the exponent bits. Inputs are clamped to [-104, 89], past
   which exp is 0 or infinity in float.
   log: x = 2^e m with m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^23 first), and with
   f = m - 1, s = f / (2 + f): log(m) = f - s (f - R), R = 2s^2/3 + 2s^4/5 + ... + 2s^12/13, so
   the correction to the exact f carries the rounding; then e ln2 added in two parts.
   sigmoid: exp(-|x|) / (1 + exp(-|x|)) or 1 / (1 + exp(-|x|)), which never overflows (the
   numerator chosen first, so one division serves both).
   tanh: e / (e + 2) with e = expm1(2|x|), whose small values come from the series without
   cancellation, and the sign of x put back; |x| is clamped to 10, where tanh is 1 in float.
   sin, cos: in double precision, which makes the reduction x = k pi/2 + r nearly exact for
   |x| <= 2^20 (pi/2 in two parts, k times the first exact), with k even for sin and odd for
   cos so that both are +-sin(r), |r| <= pi/2, from its Taylor series to r^13, and the result
   rounded to float; larger |x| go to the C library.
   erf: u + u Q(u^2) for |u| <= 1 (Q of degree 6, fitted to erf(u)/u - 1); beyond,
   1 - exp(-u^2) R(|u|), R of degree 10 fitted to erfc(a) e^(a^2) on [1, 3.92], and 1 past
   3.92; exp(-u^2) is taken so that the rounding of u^2 is not lost (_exp_neg_square), which
   keeps erfc's relative error small where u^2 is large.
   GELU: x Phi(x) with 2 Phi(x) = 1 + erf(x / sqrt 2), taken as erfc(|x| / sqrt 2) itself
   below x = -sqrt 2 (no cancellation there, unlike the formula on the C library's erf), and
   exp(-x^2 / 2) from x itself. Its derivative Phi(x) + x phi(x) shares that exponential.
   Largest error over every float, against double precision: exp 1.22 ulp (0.94 where the
   compiler fuses multiplies and adds, as it does in GNU C modes but not with -std=c99), log
   0.95, sigmoid 2.40, tanh 3.26, sin and cos 0.52 (every float of magnitude up to 2^20); the C
   library's are within about 1 (AUTODIFF_NO_DISPATCH keeps them). erf 1.21 (1.40 without
   fused multiply-adds) over every float. Over every fifth float: GELU 7.6 from -5.54 up (the
   most from the cancellation in 1 + erf just above -sqrt 2), and 0 below, where |GELU| < 8.3e-8; its derivative, whose
   terms cancel near -0.75, within 3.9 ulps of Phi(x) + |x| phi(x) from -5.5 up, and within
   1.5e-8 below. NaN, infinities, zeros and subnormals give what C's functions give.
   tests/test_tape.c checks these bounds on a million inputs. */
/* y[i..] = FN(x[i..]) for the whole vectors from i on (in the functions below: v, i, n, VL) */
#define AD__VECTOR_LOOP(FN)                                                                      \
    for (; i + VL <= n; i += VL) {                                                               \
        memcpy(&v, x + i, sizeof v);                                                             \
        v = FN(v);                                                                               \
        memcpy(y + i, &v, sizeof v);                                                             \
    }
#define AD__DEFINE_VECTOR_MATH(PFX, ATTR, VBYTES, STEPS)                                         \
    typedef float PFX##_vf __attribute__((vector_size(VBYTES)));                                 \
    typedef int32_t PFX##_vi __attribute__((vector_size(VBYTES)));                               \
    typedef uint32_t PFX##_vu __attribute__((vector_size(VBYTES)));                              \
    typedef float PFX##_vh __attribute__((vector_size(VBYTES / 2))); /* half the floats */       \
    typedef double PFX##_vd __attribute__((vector_size(VBYTES)));    /* as doubles */            \
    typedef uint64_t PFX##_vl __attribute__((vector_size(VBYTES)));                              \
    /* lanes of a where mask (a comparison's result) is set, else of b */                        \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_select(PFX##_vi mask, PFX##_vf a, PFX##_vf b) \
    {                                                                                            \
        PFX##_vi ai, bi, r;                                                                      \
        memcpy(&ai, &a, sizeof ai);                                                              \
        memcpy(&bi, &b, sizeof bi);                                                              \
        r = (ai & mask) | (bi & ~mask);                                                          \
        memcpy(&a, &r, sizeof a);                                                                \
        return a;                                                                                \
    }                                                                                            \
    /* the sign bits of x (sign 1) or everything else (sign 0) */                                \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_bits(PFX##_vf x, int sign)          \
    {                                                                                            \
        PFX##_vu b;                                                                              \
        memcpy(&b, &x, sizeof b);                                                                \
        b &= sign ? 0x80000000u : 0x7FFFFFFFu;                                                   \
        memcpy(&x, &b, sizeof x);                                                                \
        return x;                                                                                \
    }                                                                                            \
    /* r with x = n ln2 + r, |r| <= ln2 / 2, and n (a whole number, as a float); adding        \
       1.5 * 2^23 rounds to an integer */                                                        \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_reduce(PFX##_vf x, PFX##_vf *n)     \
    {                                                                                            \
        PFX##_vf nf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;                    \
        *n = nf;                                                                                 \
        return (x - nf * 0.693359375f) - nf * -2.12194440e-4f;                                   \
    }                                                                                            \
    /* e^r - 1 for |r| <= ln2 / 2 */                                                             \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_expm1_reduced(PFX##_vf r)           \
    {                                                                                            \
        PFX##_vf q = r * (1.0f / 5040) + (1.0f / 720);                                           \
        q = q * r + (1.0f / 120);                                                                \
        q = q * r + (1.0f / 24);                                                                 \
        q = q * r + (1.0f / 6);                                                                  \
        q = q * r + 0.5f;                                                                        \
        q = q * r + 1.0f;                                                                        \
        return q * r;                                                                            \
    }                                                                                            \
    /* 2^n for n in [-126, 127] */                                                               \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_pow2(PFX##_vi n)                    \
    {                                                                                            \
        PFX##_vu b = (PFX##_vu)(n + 127) << 23;                                                  \
        PFX##_vf f;                                                                              \
        memcpy(&f, &b, sizeof f);                                                                \
        return f;                                                                                \
    }                                                                                            \
    /* p 2^n for n in [-151, 128], with p near 1, in two factors so that a subnormal result is   \
       rounded once (machines without a scaling instruction) */                                  \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_ldexp_in_halves(PFX##_vf p, PFX##_vf n) \
    {                                                                                            \
        PFX##_vi whole = __builtin_convertvector(n, PFX##_vi), half = whole >> 1;                \
        return p * PFX##_pow2(half) * PFX##_pow2(whole - half);                                  \
    }                                                                                            \
    /* x clamped to [-104, 89] first, past which exp is 0 or infinity in float; _MAX and _MIN     \
       give their second operand where one is NaN, so a NaN runs through to the result */        \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_exp(PFX##_vf x)                     \
    {                                                                                            \
        PFX##_vf c, n, r, zero;                                                                  \
        memset(&zero, 0, sizeof zero);                                                           \
        c = STEPS##_MIN(zero + 89.0f, STEPS##_MAX(zero - 104.0f, x));                            \
        r = PFX##_reduce(c, &n);                                                                 \
        return STEPS##_LDEXP(PFX##_expm1_reduced(r) + 1.0f, n);                                  \
    }                                                                                            \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_sigmoid(PFX##_vf x)                 \
    {                                                                                            \
        PFX##_vf e = PFX##_exp(-PFX##_bits(x, 0)), one;                                          \
        memset(&one, 0, sizeof one);                                                             \
        one += 1.0f;                                                                             \
        return PFX##_select(x >= 0.0f, one, e) / (1.0f + e); /* one division for both */         \
    }                                                                                            \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_tanh(PFX##_vf x)                    \
    {                                                                                            \
        PFX##_vi nan = x != x;                                                                   \
        PFX##_vf a = PFX##_bits(x, 0), n, r, s, e, t, zero;                                      \
        memset(&zero, 0, sizeof zero);                                                           \
        a = PFX##_select(a > 10.0f, zero + 10.0f, a);                                            \
        r = PFX##_reduce(PFX##_select(nan, zero, a + a), &n);                                    \
        s = PFX##_pow2(__builtin_convertvector(n, PFX##_vi));                                    \
        e = s * PFX##_expm1_reduced(r) + (s - 1.0f);                                             \
        t = e / (e + 2.0f);                                                                      \
        {                                                                                        \
            PFX##_vu tb, sb; /* t >= 0: the sign of x ORed in */                                 \
            memcpy(&tb, &t, sizeof tb);                                                          \
            memcpy(&sb, &x, sizeof sb);                                                          \
            tb |= sb & 0x80000000u;                                                              \
            memcpy(&t, &tb, sizeof t);                                                           \
        }                                                                                        \
        return PFX##_select(nan, x, t);                                                          \
    }                                                                                            \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_log(PFX##_vf x)                     \
    {                                                                                            \
        PFX##_vi nan = x != x, tiny = x < 1.17549435e-38f, high, e;                              \
        PFX##_vf m, f, s, z, p, r, ef, zero;                                                     \
        PFX##_vu b;                                                                              \
        memset(&zero, 0, sizeof zero);                                                           \
        { /* subnormals (and 0, negatives) scaled by 2^23 first */                               \
            PFX##_vf xs = PFX##_select(tiny, x * 8388608.0f, x);                                 \
            memcpy(&b, &xs, sizeof b);                                                           \
        }                                                                                        \
        e = (PFX##_vi)(b >> 23 & 0xFFu) - 127 - (tiny & 23);                                     \
        b = (b & 0x007FFFFFu) | 0x3F800000u;                                                     \
        memcpy(&m, &b, sizeof m);                                                                \
        high = m > 1.41421356f; /* m in [1, 2) moved to [sqrt(1/2), sqrt(2)) */                  \
        m = PFX##_select(high, m * 0.5f, m);                                                     \
        e -= high;                                                                               \
        f = m - 1.0f;                                                                            \
        s = f / (2.0f + f);                                                                      \
        z = s * s;                                                                               \
        p = z * (2.0f / 13) + (2.0f / 11);                                                       \
        p = p * z + (2.0f / 9);                                                                  \
        p = p * z + (2.0f / 7);                                                                  \
        p = p * z + (2.0f / 5);                                                                  \
        p = p * z + (2.0f / 3);                                                                  \
        r = f - s * (f - z * p);                                                                 \
        b = (PFX##_vu)(e + 0x4B400000); /* e as a float: 1.5 * 2^23 + e, less 1.5 * 2^23 */      \
        memcpy(&ef, &b, sizeof ef);                                                              \
        ef -= 12582912.0f;                                                                       \
        r = ef * 0.693359375f + (ef * -2.12194440e-4f + r);                                      \
        r = PFX##_select(x == 0.0f, zero - INFINITY, r);                                         \
        r = PFX##_select(x == INFINITY, x, r);                                                   \
        r = PFX##_select(x < 0.0f, zero + NAN, r);                                               \
        return PFX##_select(nan, x, r);                                                          \
    }                                                                                            \
    /* sin (quarter 0) or cos (quarter 1) of doubles x, |x| <= 2^20: x = k pi/2 + r, |r| <=    \
       pi/2, with k even for sin and odd for cos (cos(x) = sin(x + pi/2)), pi/2 in two parts,    \
       the first with 32 bits so that k times it is exact; then sin(x) = (-1)^m sin(r), k = 2m,  \
       or cos(x) = (-1)^(m+1) sin(r), k = 2m + 1, with sin(r) from its series to r^13 */         \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vd PFX##_sincos_wide(PFX##_vd x, int quarter) \
    {                                                                                            \
        PFX##_vd t = (x * 0.31830988618379067 - 0.5 * quarter) + 6755399441055744.0;            \
        PFX##_vd m = t - 6755399441055744.0, k = m * 2.0 + (double)quarter;                      \
        PFX##_vd r = (x - k * 1.5707963267341256) - k * 6.077100506506192e-11, z = r * r, p;     \
        PFX##_vl q, sb;                                                                          \
        memcpy(&q, &t, sizeof q); /* 1.5 * 2^52 + m: m in the low bits */                        \
        p = z * (-1.0 / 6227020800) + (1.0 / 39916800);                                          \
        p = p * z - (1.0 / 362880);                                                              \
        p = p * z + (1.0 / 5040);                                                                \
        p = p * z - (1.0 / 120);                                                                 \
        p = p * z + (1.0 / 6);                                                                   \
        p = r - r * z * p;                                                                       \
        memcpy(&sb, &p, sizeof sb);                                                              \
        sb ^= (q + (uint64_t)quarter) << 63;                                                     \
        memcpy(&p, &sb, sizeof p);                                                               \
        return p;                                                                                \
    }                                                                                            \
    /* sin or cos of floats, through doubles; lanes past 2^20 in magnitude (and infinities and  \
       NaN) are left to the C library, and sin keeps the sign of a zero */                       \
    static ATTR AD__UNUSED AD__ALWAYS_INLINE AD__INLINE_KEYWORD PFX##_vf PFX##_sincos(PFX##_vf x, int quarter) \
    {                                                                                            \
        enum { VL = VBYTES / 4 };                                                                \
        PFX##_vh lo, hi;                                                                         \
        PFX##_vf y;                                                                              \
        PFX##_vi far = ~(PFX##_bits(x, 0) <= 1048576.0f);                                        \
        uint64_t w[VBYTES / 8], any = 0;                                                         \
        int k;                                                                                   \
        lo = STEPS##_LOW(x);                                                                     \
        hi = STEPS##_HIGH(x);                                                                    \
        lo = __builtin_convertvector(                                                            \
            PFX##_sincos_wide(__builtin_convertvector(lo, PFX##_vd), quarter), PFX##_vh);        \
        hi = __builtin_convertvector(                                                            \
            PFX##_sincos_wide(__builtin_convertvector(hi, PFX##_vd), quarter), PFX##_vh);        \
        y = STEPS##_JOIN(lo, hi);                                                                \
        if (!quarter) y = PFX##_select(x == 0.0f, x, y);                                         \
        memcpy(w, &far, sizeof w);                                                               \
        for (k = 0; k < VBYTES / 8; k++) any |= w[k];                                            \
        if (any) {                                                                               \
            float xs[VL], ys[VL];                                                                \
            int32_t fs[VL];                                                                      \
            memcpy(xs, &x, sizeof xs);                                                           \
            memcpy(ys, &y, sizeof ys);                                                           \
            memcpy(fs, &far, sizeof fs);                                                         \
            for (k = 0; k < VL; k++)                                                             \
                if (fs[k]) ys[k] = quarter ? cosf(xs[k]) : sinf(xs[k]);                          \
            memcpy(&y, ys, sizeof y);                                                            \
        }                                                                                        \
        return y;                                                                                \
    }                                                                                            \
    static ATTR AD__UNUSED AD__ALWAYS_INLINE AD__INLINE_KEYWORD PFX##_vf PFX##_sin(PFX##_vf x)   \
    {                                                                                            \
        return PFX##_sincos(x, 0);                                                               \
    }                                                                                            \
    static ATTR AD__UNUSED AD__ALWAYS_INLINE AD__INLINE_KEYWORD PFX##_vf PFX##_cos(PFX##_vf x)   \
    {                                                                                            \
        return PFX##_sincos(x, 1);                                                               \
    }                                                                                            \
    /* exp(-scale x^2), scale 1 or 1/2: with x = a + b, a the leading 12 bits of x, a^2 is      \
       exact in float, and exp(-scale x^2) = exp(-scale a^2) exp(-t) with t = scale b (2a + b)  \
       small (|t| < 2^-7 where the result is above float's smallest), whose exponential is its   \
       series to t^3 */                                                                          \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_exp_neg_square(PFX##_vf x, float scale) \
    {                                                                                            \
        PFX##_vu bits;                                                                           \
        PFX##_vf a, b, t, p, zero;                                                               \
        memset(&zero, 0, sizeof zero);                                                           \
        memcpy(&bits, &x, sizeof bits);                                                          \
        bits &= 0xFFFFF000u;                                                                     \
        memcpy(&a, &bits, sizeof a);                                                             \
        b = x - a;                                                                               \
        t = scale * (b * (2.0f * a + b));                                                        \
        p = 1.0f - t * (1.0f - t * (0.5f - t * (1.0f / 6)));                                     \
        a = scale * (a * a);                                                                     \
        return PFX##_select(a > 104.0f, zero, PFX##_exp(-a) * p); /* 0 in float from 104 on */   \
    }                                                                                            \
    /* erfc(a) = e R(a) for a in [1, 3.92], with e = exp(-a^2) and R a polynomial in a - 2.46 */ \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_erfc_tail(PFX##_vf a, PFX##_vf e)   \
    {                                                                                            \
        PFX##_vf t = a - 2.46f, r = t * 1.83605061e-6f - 6.96567031e-6f;                         \
        r = r * t + 1.59461215e-5f;                                                              \
        r = r * t - 5.89610463e-5f;                                                              \
        r = r * t + 2.30094796e-4f;                                                              \
        r = r * t - 7.91371276e-4f;                                                              \
        r = r * t + 2.61800690e-3f;                                                              \
        r = r * t - 8.40632338e-3f;                                                              \
        r = r * t + 2.59225219e-2f;                                                              \
        r = r * t - 7.63816535e-2f;                                                              \
        r = r * t + 2.13820666e-1f;                                                              \
        return e * r;                                                                            \
    }                                                                                            \
    /* erf(u) for |u| <= 1 as u + u Q(u^2), the small correction carrying the rounding; into    \
       *tail, erfc(|u|) for |u| > 1 (0 past 3.92, where erf is 1 in float), given e = exp(-u^2) */ \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_erf_parts(PFX##_vf u, PFX##_vf e,     \
                                                                       PFX##_vf *tail)           \
    {                                                                                            \
        PFX##_vf a = PFX##_bits(u, 0), z = u * u, q, zero;                                       \
        memset(&zero, 0, sizeof zero);                                                           \
        q = z * 7.93338259e-5f - 8.03481380e-4f;                                                 \
        q = q * z + 5.19121485e-3f;                                                              \
        q = q * z - 2.68553980e-2f;                                                              \
        q = q * z + 1.12836257e-1f;                                                              \
        q = q * z - 3.76126289e-1f;                                                              \
        q = q * z + 1.28379166e-1f;                                                              \
        *tail = PFX##_select(a > 3.92f, zero, PFX##_erfc_tail(a, e));                            \
        return u + u * q;                                                                        \
    }                                                                                            \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_erf(PFX##_vf u)                     \
    {                                                                                            \
        PFX##_vf tail, near = PFX##_erf_parts(u, PFX##_exp_neg_square(u, 1.0f), &tail), far = 1.0f - tail; \
        PFX##_vu fb, ub;                                                                         \
        memcpy(&fb, &far, sizeof fb);                                                            \
        memcpy(&ub, &u, sizeof ub);                                                              \
        fb |= ub & 0x80000000u; /* far >= 0: the sign of u ORed in */                            \
        memcpy(&far, &fb, sizeof far);                                                           \
        return PFX##_select(PFX##_bits(u, 0) <= 1.0f, near, far);                                \
    }                                                                                            \
    /* 1 + erf(x / sqrt 2) = 2 Phi(x), given e = exp(-x^2 / 2); below x = -sqrt 2 it is         \
       erfc(-x / sqrt 2) itself, without cancellation */                                        \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_two_phi(PFX##_vf x, PFX##_vf e)     \
    {                                                                                            \
        PFX##_vf u = x * (float)AD__INV_SQRT2, tail, near = PFX##_erf_parts(u, e, &tail);        \
        PFX##_vf far = PFX##_select(u > 1.0f, 2.0f - tail, tail);                                \
        return PFX##_select(PFX##_bits(u, 0) <= 1.0f, 1.0f + near, far);                         \
    }                                                                                            \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_gelu(PFX##_vf x)                    \
    {                                                                                            \
        return 0.5f * x * PFX##_two_phi(x, PFX##_exp_neg_square(x, 0.5f));                        \
    }                                                                                            \
    /* GELU's derivative Phi(x) + x phi(x) */                                                    \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_gelu_grad(PFX##_vf x)               \
    {                                                                                            \
        PFX##_vf e = PFX##_exp_neg_square(x, 0.5f);                                               \
        return 0.5f * PFX##_two_phi(x, e) + x * ((float)AD__INV_SQRT_2PI * e);                   \
    }                                                                                            \
    /* GELU and its derivative from one exponential and one Phi, the same bits as the two       \
       functions above: what a recorded forward saves for its backward */                       \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_gelu_and_grad(PFX##_vf x, PFX##_vf *grad) \
    {                                                                                            \
        PFX##_vf e = PFX##_exp_neg_square(x, 0.5f), t = PFX##_two_phi(x, e);                     \
        *grad = 0.5f * t + x * ((float)AD__INV_SQRT_2PI * e);                                    \
        return 0.5f * x * t;                                                                     \
    }                                                                                            \
    static ATTR AD__UNUSED void PFX##_gelu_with_grad(const float *x, float *y, float *d, size_t n) \
    {                                                                                            \
        enum { VL = VBYTES / 4 };                                                                \
        size_t i = 0;                                                                            \
        PFX##_vf v, g;                                                                           \
        for (; i + VL <= n; i += VL) {                                                           \
            memcpy(&v, x + i, sizeof v);                                                         \
            v = PFX##_gelu_and_grad(v, &g);                                                      \
            memcpy(y + i, &v, sizeof v);                                                         \
            memcpy(d + i, &g, sizeof g);                                                         \
        }                                                                                        \
        if (i < n) {                                                                             \
            memset(&v, 0, sizeof v);                                                             \
            memcpy(&v, x + i, (n - i) * sizeof(float));                                          \
            v = PFX##_gelu_and_grad(v, &g);                                                      \
            memcpy(y + i, &v, (n - i) * sizeof(float));                                          \
            memcpy(d + i, &g, (n - i) * sizeof(float));                                          \
        }                                                                                        \
    }                                                                                            \
    /* y = f(x) for n floats, f one of exp, log, sigmoid, tanh, sin, cos (kind); a last part     \
       vector goes through a padded copy */                                                      \
    static ATTR AD__UNUSED AD__INLINE_KEYWORD PFX##_vf PFX##_apply(int kind, PFX##_vf v)         \
    {                                                                                            \
        switch (kind) {                                                                          \
        case AD__U_EXP: return PFX##_exp(v);                                                     \
        case AD__U_LOG: return PFX##_log(v);                                                     \
        case AD__U_SIGMOID: return PFX##_sigmoid(v);                                             \
        case AD__U_SIN: return PFX##_sin(v);                                                     \
        case AD__U_COS: return PFX##_cos(v);                                                     \
        case AD__U_ERF: return PFX##_erf(v);                                                     \
        case AD__U_GELU: return PFX##_gelu(v);                                                   \
        case AD__VM_GELU_GRAD: return PFX##_gelu_grad(v);                                        \
        default: return PFX##_tanh(v);                                                           \
        }                                                                                        \
    }                                                                                            \
    static ATTR AD__UNUSED void PFX##_unary(int kind, const float *x, float *y, size_t n)        \
    {                                                                                            \
        enum { VL = VBYTES / 4 };                                                                \
        size_t i = 0;                                                                            \
        PFX##_vf v;                                                                              \
        /* a loop for each function, so that no choice is made inside the loop */               \
        if (kind == AD__U_EXP) AD__VECTOR_LOOP(PFX##_exp)                                        \
        else if (kind == AD__U_LOG) AD__VECTOR_LOOP(PFX##_log)                                   \
        else if (kind == AD__U_SIGMOID) AD__VECTOR_LOOP(PFX##_sigmoid)                           \
        else if (kind == AD__U_SIN) AD__VECTOR_LOOP(PFX##_sin)                                   \
        else if (kind == AD__U_COS) AD__VECTOR_LOOP(PFX##_cos)                                   \
        else if (kind == AD__U_ERF) AD__VECTOR_LOOP(PFX##_erf)                                   \
        else if (kind == AD__U_GELU) AD__VECTOR_LOOP(PFX##_gelu)                                 \
        else if (kind == AD__VM_GELU_GRAD) AD__VECTOR_LOOP(PFX##_gelu_grad)                      \
        else AD__VECTOR_LOOP(PFX##_tanh)                                                         \
        if (i < n) {                                                                             \
            memset(&v, 0, sizeof v);                                                             \
            memcpy(&v, x + i, (n - i) * sizeof(float));                                          \
            v = PFX##_apply(kind, v);                                                            \
            memcpy(y + i, &v, (n - i) * sizeof(float));                                          \
        }                                                                                        \
    }
/* Each instruction set's steps for the functions above: the larger and smaller of a and b (b
   where either is NaN, as the instructions do), p 2^n for whole numbers n, and a vector's low
   and high halves and a vector from its halves, in registers (through memory, loads of halves
   of a store, or of one of two stores, stall) */
#define AD__VM512_MAX(a, b) ((ad__vm512_vf)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define AD__VM512_MIN(a, b) ((ad__vm512_vf)_mm512_min_ps((__m512)(a), (__m512)(b)))
#define AD__VM512_LDEXP(p, n) ((ad__vm512_vf)_mm512_scalef_ps((__m512)(p), (__m512)(n)))
#define AD__VM512_JOIN(lo, hi) \
    ((ad__vm512_vf)_mm512_insertf64x4(_mm512_castpd256_pd512((__m256d)(lo)), (__m256d)(hi), 1))
#define AD__VM512_LOW(x) ((ad__vm512_vh)_mm512_castps512_ps256((__m512)(x)))
#define AD__VM512_HIGH(x) ((ad__vm512_vh)_mm512_extractf64x4_pd((__m512d)(x), 1))
#define AD__VM256_MAX(a, b) ((ad__vm256_vf)_mm256_max_ps((__m256)(a), (__m256)(b)))
#define AD__VM256_MIN(a, b) ((ad__vm256_vf)_mm256_min_ps((__m256)(a), (__m256)(b)))
#define AD__VM256_LDEXP(p, n) ad__vm256_ldexp_in_halves(p, n)
#define AD__VM256_JOIN(lo, hi) \
    ((ad__vm256_vf)_mm256_insertf128_ps(_mm256_castps128_ps256((__m128)(lo)), (__m128)(hi), 1))
#define AD__VM256_LOW(x) ((ad__vm256_vh)_mm256_castps256_ps128((__m256)(x)))
#define AD__VM256_HIGH(x) ((ad__vm256_vh)_mm256_extractf128_ps((__m256)(x), 1))
AD__DEFINE_VECTOR_MATH(ad__vm512, __attribute__((target("avx512f,avx2,fma"))), 64, AD__VM512)
AD__DEFINE_VECTOR_MATH(ad__vm256, __attribute__((target("avx2,fma"))), 32, AD__VM256)
#undef AD__DEFINE_VECTOR_MATH
#undef AD__VECTOR_LOOP
#endif

/* Computes exp, log, sigmoid, tanh, sin, cos, erf, GELU or GELU's derivative (AD__VM_GELU_GRAD)
   of n values with the vector functions above where they exist; returns 0 (nothing done) for
   other kinds, other machines and the double build. */
AD__PRIVATE int ad__unary_vectorised(int kind, const ad_real *x, ad_real *y, size_t n)
{
    if (kind != AD__U_EXP && kind != AD__U_LOG && kind != AD__U_SIGMOID && kind != AD__U_TANH &&
        kind != AD__U_SIN && kind != AD__U_COS && kind != AD__U_ERF && kind != AD__U_GELU &&
        kind != AD__VM_GELU_GRAD)
        return 0;
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    if (ad__isa() == AD__ISA_AVX512) {
        ad__vm512_unary(kind, x, y, n);
        return 1;
    }
    if (ad__isa() == AD__ISA_AVX2) {
        ad__vm256_unary(kind, x, y, n);
        return 1;
    }
#else
    (void)x;
    (void)y;
    (void)n;
#endif
    return 0;
}

/* Whether GELU's forward computes its derivative too (ad__gelu_with_grad): where the vector
   functions run, the derivative costs about what GELU does (an exponential and erf), and the
   forward has both parts at hand; the backward then multiplies by the saved values instead of
   evaluating them again (a GPT layer's GELU on 768 x 512 values). */
AD__PRIVATE int ad__gelu_saves_grad(void)
{
    return ad__unary_vectorised(AD__U_GELU, NULL, NULL, 0);
}

/* y = GELU(x) and d = GELU'(x) for n values; only where ad__gelu_saves_grad. */
AD__PRIVATE void ad__gelu_with_grad(const ad_real *x, ad_real *y, ad_real *d, size_t n)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    if (ad__isa() == AD__ISA_AVX512) ad__vm512_gelu_with_grad(x, y, d, n);
    else ad__vm256_gelu_with_grad(x, y, d, n);
#else
    (void)x;
    (void)y;
    (void)d;
    (void)n;
    AUTODIFF_ASSERT(0);
#endif
}

AD__PRIVATE void ad__unary_kernel(int kind, const ad_real *AD__RESTRICT xs, ad_real *AD__RESTRICT y,
                                  size_t n, ad_real p0, ad_real p1)
{
    size_t i;
    (void)p1;
    if (ad__unary_vectorised(kind, xs, y, n)) return;
    switch (kind) {
#define AD__UNARY_FORWARD(ID, NAME, SPLIT, FORWARD, DERIV)                                           \
    case AD__U_##ID:                                                                                 \
        for (i = 0; i < n; i++) {                                                                    \
            ad_real x = xs[i];                                                                       \
            y[i] = (FORWARD);                                                                        \
        }                                                                                            \
        break;
        AD__UNARY_OPS(AD__UNARY_FORWARD)
#undef AD__UNARY_FORWARD
    default: AUTODIFF_ASSERT(0);
    }
}

/* Work on n items of `values` values each (softmax rows, pooling planes), split over the tape's
   threads as ad__parallel_range does from AD__SPLIT_HEAVY values on, in runs of `block` items. */
AD__INLINE void ad__parallel_items(ad_tape *T, ad__range_fn fn, const void *ctx, size_t n, size_t values,
                                   size_t block)
{
    size_t each = values > 0 ? values : 1;
    ad__parallel_range(T, fn, ctx, n, (AD__SPLIT_HEAVY + each - 1) / each, block);
}

/* The size from which a unary function's forward or backward loop is split over threads. */
AD__INLINE size_t ad__unary_split(int kind)
{
#define AD__UNARY_SPLIT(ID, NAME, SPLIT, FORWARD, DERIV) AD__SPLIT_##SPLIT,
    static const size_t split[] = {AD__UNARY_OPS(AD__UNARY_SPLIT) 0};
#undef AD__UNARY_SPLIT
    return split[kind];
}

typedef struct ad__unary_job {
    int kind;
    const ad_real *x;
    ad_real *y;
    ad_real *deriv;    /* f'(x) computed with f(x) when not NULL (GELU) */
    ad_real p0, p1;
} ad__unary_job;

AD__PRIVATE void ad__unary_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__unary_job *j = (const ad__unary_job *)ctx;
    if (j->deriv) ad__gelu_with_grad(j->x + lo, j->y + lo, j->deriv + lo, hi - lo);
    else ad__unary_kernel(j->kind, j->x + lo, j->y + lo, hi - lo, j->p0, j->p1);
}

AD__PRIVATE void ad__unary_backward(ad__sweep *S, ad__node *n, ad_tensor *g);
AD__PRIVATE void ad__unary_backward_one(ad__sweep *S, ad__node *n, ad_tensor *g);

/* kind(a) of a one-element a (scalar tapes): the result and its entry in one block, as for
   binary ops (ad__binary_one). */
AD__INLINE ad_tensor *ad__unary_one(ad_tape *T, const char *op, ad_tensor *a, int kind, ad_real p0, ad_real p1)
{
    int recorded = T->grad_enabled && a->requires_grad;
    unsigned char *block = ad__one_block(T, op, recorded);
    ad_tensor *y = (ad_tensor *)block;
    ad__node *n;
    if (!block) return NULL;
    ad__tensor_init(T, y, a->ndim, a->shape, 1, (ad_real *)(block + AD__ONE_HEADER_BYTES));
    ad__unary_kernel(kind, a->data, y->data, 1, p0, p1);
    if (recorded) {
        n = (ad__node *)(block + AD__ONE_ENTRY_OFFSET);
        ad__link_entry(T, n, y, ad__unary_backward_one, 1);
        n->reads_held = AD__GRAD_VALUE;
        n->op = op;
        n->in[0] = a;
        n->st.unary.kind = kind;
        n->st.unary.p0 = p0;
        n->st.unary.p1 = p1;
        n->st.unary.deriv = NULL;
    }
    if (T->anomaly && !ad__anomaly_forward(T, op, y, &a, 1, &T->sink)) return NULL;
    return y;
}

/* kind(a) with its parameters; errors name op, the function the caller called. */
AD__PRIVATE ad_tensor *ad__unary_as(ad_tape *T, const char *op, ad_tensor *a, int kind, ad_real p0, ad_real p1)
{
    ad__unary_job job;
    ad_tensor *y;
    ad__node *n;
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, op, "the input", a)) return NULL;
    if (a->size == 1) return ad__unary_one(T, op, a, kind, p0, p1);
    y = ad__like(T, op, a);
    if (!y) return NULL;
    job.kind = kind;
    job.x = a->data;
    job.y = y->data;
    job.deriv = NULL;
    job.p0 = p0;
    job.p1 = p1;
    if (kind == AD__U_GELU && ad__gelu_saves_grad() && ad__would_record(T, &a, 1) &&
        !(job.deriv = (ad_real *)ad__alloc_aligned(T, a->size * sizeof(ad_real), AD__ALIGN, op)))
        return NULL;
    ad__parallel_range(T, ad__unary_range, &job, a->size, ad__unary_split(kind), AD__STORE_BLOCK);
    n = ad__record1(T, op, y, ad__unary_backward, a);
    if (!n) return NULL;
    n->reads_held = AD__GRAD_UNIFORM;
    n->st.unary.kind = kind;
    n->st.unary.p0 = p0;
    n->st.unary.p1 = p1;
    n->st.unary.deriv = job.deriv;
    return y;
}

AD__PRIVATE ad_tensor *ad__unary(ad_tape *T, ad_tensor *a, int kind, ad_real p0, ad_real p1)
{
    return ad__unary_as(T, ad__unary_names[kind], a, kind, p0, p1);
}

/* dx (+)= g * f'(x) over the values [lo, hi), for sweeps that do not record. g_period 0: g
   has one value per element; else g repeats one value g_period times, and each run of that
   many elements reads it from the start (a gradient held as one value, AD__GRAD_UNIFORM).
   in_place: d holds g itself and is multiplied by f'(x) (ad__grad_take_over); g is not read. */
typedef struct ad__unary_grad_job {
    int kind, add, in_place;
    const ad_real *x, *y, *g;
    const ad_real *deriv;    /* f'(x) saved by the forward, or NULL: computed here */
    ad_real *d;
    ad_real p0, p1;
    size_t g_period;
} ad__unary_grad_job;

/* d (+)= g f, or d *= f in place (g unread), for factors f computed beforehand: by the vector
   functions a block at a time, or by the forward (GELU's saved derivative) */
AD__PRIVATE void ad__grad_times(const ad_real *AD__RESTRICT f, const ad_real *AD__RESTRICT g,
                                ad_real *AD__RESTRICT d, size_t n, int add, int in_place)
{
    size_t i;
    if (in_place)
        for (i = 0; i < n; i++) d[i] *= f[i];
    else if (add)
        for (i = 0; i < n; i++) d[i] += g[i] * f[i];
    else
        for (i = 0; i < n; i++) d[i] = g[i] * f[i];
}

/* d (+)= g f'(x) with the vector functions, in blocks through a buffer, where f' is one: for sin
   cos(x), for cos -sin(x) (the forward ops' own values, as in the recorded backward: ad_cos, ad_neg
   of ad_sin), for GELU Phi(x) + x phi(x); d *= f'(x) in place (g unread). Returns 0 (nothing
   done) for other kinds and where there are no vector functions. */
AD__PRIVATE int ad__unary_grad_vectorised(int kind, const ad_real *AD__RESTRICT x, const ad_real *AD__RESTRICT g,
                                          ad_real *AD__RESTRICT d, size_t n, int add, int in_place)
{
    enum { BLOCK = 256 };
    ad_real f[BLOCK];
    size_t at, len, i;
    int factor = kind == AD__U_SIN    ? AD__U_COS
                 : kind == AD__U_COS  ? AD__U_SIN
                 : kind == AD__U_GELU ? AD__VM_GELU_GRAD
                                      : -1;
    if (factor < 0 || !ad__unary_vectorised(factor, x, f, 0)) return 0;
    for (at = 0; at < n; at += len) {
        len = n - at < (size_t)BLOCK ? n - at : (size_t)BLOCK;
        ad__unary_vectorised(factor, x + at, f, len);
        if (kind == AD__U_COS)
            for (i = 0; i < len; i++) f[i] = -f[i];
        ad__grad_times(f, g + at, d + at, len, add, in_place);
    }
    return 1;
}

/* The rows' derivatives on values: the factor of each element in the fused backward. */
#define AD__DSL_MODE VALUE

/* The fused loops: sin, cos and GELU take the vector functions where they are; the factor gets a
   statement of its own, since GCC if-converts (and vectorises) a conditional factor only then;
   one element (scalar tapes) gets no loop. */
AD__PRIVATE void ad__unary_grad_run(const void *ctx, size_t lo, size_t hi, const ad_real *AD__RESTRICT g)
{
    const ad__unary_grad_job *j = (const ad__unary_grad_job *)ctx;
    const ad_real *AD__RESTRICT xv = j->x + lo, *AD__RESTRICT yv = j->y + lo;
    ad_real p0 = j->p0, p1 = j->p1, *AD__RESTRICT d = j->d + lo;
    size_t i, size = hi - lo;
    int add = j->add, kind = j->kind, in_place = j->in_place;
    (void)p1;
    (void)yv;
    if (j->deriv) {
        ad__grad_times(j->deriv + lo, g, d, size, add, in_place);
        return;
    }
    if (ad__unary_grad_vectorised(kind, xv, g, d, size, add, in_place)) return;
    switch (kind) {
#define AD__UNARY_FUSED(ID, NAME, SPLIT, FORWARD, DERIV)                                             \
    case AD__U_##ID:                                                                                 \
        if (size == 1) {                                                                             \
            ad_real f_;                                                                              \
            i = 0;                                                                                   \
            f_ = (DERIV);                                                                            \
            if (in_place) d[0] *= f_; else if (add) d[0] += g[0] * f_; else d[0] = g[0] * f_;         \
        } else if (in_place) {                                                                       \
            for (i = 0; i < size; i++) { ad_real f_ = (DERIV); d[i] *= f_; }                         \
        } else if (add) {                                                                            \
            for (i = 0; i < size; i++) { ad_real f_ = (DERIV); d[i] += g[i] * f_; }                  \
        } else {                                                                                     \
            for (i = 0; i < size; i++) { ad_real f_ = (DERIV); d[i] = g[i] * f_; }                   \
        }                                                                                            \
        break;
        AD__UNARY_OPS(AD__UNARY_FUSED)
#undef AD__UNARY_FUSED
    default: AUTODIFF_ASSERT(0);
    }
}
#undef AD__DSL_MODE

AD__PRIVATE void ad__unary_grad_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__unary_grad_job *j = (const ad__unary_grad_job *)ctx;
    ad__grad_runs(ad__unary_grad_run, ctx, lo, hi, j->g, j->g_period);
}

/* dx (+)= g * f'(x) in one pass, for sweeps that do not record. A shift (affine with scale 1)
   passes g on: x shares its buffer until a second contribution arrives. */
AD__PRIVATE void ad__unary_backward_fused(ad__sweep *S, ad__node *n, ad_tensor *gt)
{
    enum { PERIOD = 1024 };
    ad_real repeated[PERIOD];
    ad__unary_grad_job job;
    int uniform = S->owned[n->out->id] == AD__GRAD_UNIFORM;
    job.kind = n->st.unary.kind;
    job.p0 = n->st.unary.p0;
    job.p1 = n->st.unary.p1;
    if (job.kind == AD__U_AFFINE && job.p0 == 1) {
        if (uniform && ad__grad_uniform(S, n->in[0], gt->data[0])) return;
        if (uniform && !(gt = ad__grad_spread(S, n->out))) return;
        ad__accum(S, n->in[0], gt, 0);
        return;
    }
    job.in_place = ad__grad_take_over(S, n, gt, n->in[0]);
    job.add = 0;
    job.d = job.in_place ? gt->data : ad__grad_target(S, n->in[0], &job.add);
    if (!job.d) return;
    job.x = n->in[0]->data;
    job.y = n->out->data;
    job.deriv = n->st.unary.deriv;
    job.g = ad__grad_source(S, n, gt, repeated, PERIOD, &job.g_period);
    ad__parallel_range(S->T, ad__unary_grad_range, &job, n->in[0]->size, ad__unary_split(job.kind),
                       AD__STORE_BLOCK);
}

/* The constant factors of piecewise-linear derivatives: 1 where x > 0 (else 0), the sign of
   x, 1 where p0 <= x <= p1, or 1 where x is 0; recorded as nothing, so no gradient flows
   through them. */
enum { AD__MASK_STEP, AD__MASK_SIGN, AD__MASK_INSIDE, AD__MASK_ZERO };

AD__PRIVATE ad_tensor *ad__mask(ad_tape *T, ad_tensor *x, int kind, ad_real p0, ad_real p1)
{
    ad_tensor *y;
    const ad_real *AD__RESTRICT xv;
    ad_real *AD__RESTRICT yv;
    size_t i;
    if (!x || !(y = ad__like(T, "ad_backward", x))) return NULL;
    xv = x->data;
    yv = y->data;
    for (i = 0; i < x->size; i++) {
        ad_real v = xv[i];
        yv[i] = kind == AD__MASK_STEP ? (v > 0 ? (ad_real)1 : (ad_real)0)
                : kind == AD__MASK_SIGN ? (v > 0 ? (ad_real)1 : (v < 0 ? (ad_real)-1 : (ad_real)0))
                : kind == AD__MASK_ZERO ? (v == 0 ? (ad_real)1 : (ad_real)0)
                                        : (v >= p0 && v <= p1 ? (ad_real)1 : (ad_real)0);
    }
    return y;
}

/* b where a > 0, else c: b step(a) + c (1 - step(a)) with the step a constant */
AD__PRIVATE ad_tensor *ad__select_positive(ad_tape *T, ad_tensor *a, ad_tensor *b, ad_tensor *c)
{
    ad_tensor *step = ad__mask(T, a, AD__MASK_STEP, 0, 0);
    return ad_add(T, ad_mul(T, b, step), ad_mul(T, c, ad_rsub_scalar(T, 1, step)));
}

/* The rows' derivatives on tensors, recorded: dy/dx as a tensor of x's shape. */
#define AD__DSL_MODE TENSOR

AD__PRIVATE ad_tensor *ad__unary_derivative(ad_tape *T, int kind, ad_tensor *x, ad_tensor *y, ad_real p0, ad_real p1)
{
    (void)y;
    switch (kind) {
#define AD__UNARY_RECORDED(ID, NAME, SPLIT, FORWARD, DERIV) case AD__U_##ID: return DERIV;
        AD__UNARY_OPS(AD__UNARY_RECORDED)
#undef AD__UNARY_RECORDED
    default: AUTODIFF_ASSERT(0); return NULL;
    }
}
#undef AD__DSL_MODE

AD__PRIVATE void ad__unary_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *x = n->in[0];
    int kind = n->st.unary.kind;
    if (!S->create_graph) {
        ad__unary_backward_fused(S, n, g);
        return;
    }
    if (kind == AD__U_AFFINE && n->st.unary.p0 == 1) {
        ad__accum(S, x, g, 0);
        return;
    }
    ad__accum(S, x, ad_mul(S->T, g, ad__unary_derivative(S->T, kind, x, n->out, n->st.unary.p0, n->st.unary.p1)), 1);
}

/* What the input of a one-element entry (scalar tapes) receives from g_value, its output's
   gradient: the fused backward's formula on one value. */
AD__HOT ad_real ad__unary_one_deriv(const ad__node *n, ad_real g_value)
{
    ad__unary_grad_job job;
    ad_real d;
    job.kind = n->st.unary.kind;
    job.add = 0;
    job.in_place = 0;
    job.x = n->in[0]->data;
    job.y = n->out->data;
    job.g = &g_value;
    job.d = &d;
    job.deriv = NULL;
    job.p0 = n->st.unary.p0;
    job.p1 = n->st.unary.p1;
    job.g_period = 0;
    ad__unary_grad_run(&job, 0, 1, job.g);
    return d;
}

/* The input's gradient of a one-element entry, from g_value, its output's. */
AD__PRIVATE void ad__unary_one_grad(ad__sweep *S, ad__node *n, ad_real g_value)
{
    if (ad__wants(S, n->in[0])) ad__accum_one(S, n->in[0], ad__unary_one_deriv(n, g_value));
}

/* The entry's backward where its output's gradient is a tensor (sweeps that record or watch);
   where it is a held value ad__sweep_values reads it itself. */
AD__PRIVATE void ad__unary_backward_one(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    if (S->create_graph) ad__unary_backward(S, n, g);
    else ad__unary_one_grad(S, n, g->data[0]);
}

AUTODIFF_API ad_tensor *ad_neg(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_NEG, 0, 0); }
AUTODIFF_API ad_tensor *ad_exp(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_EXP, 0, 0); }
AUTODIFF_API ad_tensor *ad_log(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_LOG, 0, 0); }
AUTODIFF_API ad_tensor *ad_sin(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_SIN, 0, 0); }
AUTODIFF_API ad_tensor *ad_cos(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_COS, 0, 0); }
AUTODIFF_API ad_tensor *ad_tanh(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_TANH, 0, 0); }
AUTODIFF_API ad_tensor *ad_sigmoid(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_SIGMOID, 0, 0); }
AUTODIFF_API ad_tensor *ad_relu(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_RELU, 0, 0); }
AUTODIFF_API ad_tensor *ad_leaky_relu(ad_tape *T, ad_tensor *a, ad_real slope)
{
    return ad__unary(T, a, AD__U_LEAKY_RELU, slope, 0);
}
AUTODIFF_API ad_tensor *ad_gelu(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_GELU, 0, 0); }
AUTODIFF_API ad_tensor *ad_sqrt(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_SQRT, 0, 0); }
AUTODIFF_API ad_tensor *ad_abs(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_ABS, 0, 0); }
AUTODIFF_API ad_tensor *ad_square(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_SQUARE, 0, 0); }
AUTODIFF_API ad_tensor *ad_pow(ad_tape *T, ad_tensor *a, ad_real p) { return ad__unary(T, a, AD__U_POW, p, 0); }
AUTODIFF_API ad_tensor *ad_log1p(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_LOG1P, 0, 0); }
AUTODIFF_API ad_tensor *ad_expm1(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_EXPM1, 0, 0); }
AUTODIFF_API ad_tensor *ad_softplus(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_SOFTPLUS, 0, 0); }
AUTODIFF_API ad_tensor *ad_silu(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_SILU, 0, 0); }
AUTODIFF_API ad_tensor *ad_erf(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_ERF, 0, 0); }
AUTODIFF_API ad_tensor *ad_atan(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_ATAN, 0, 0); }
AUTODIFF_API ad_tensor *ad_reciprocal(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_RECIPROCAL, 0, 0); }
AUTODIFF_API ad_tensor *ad_rsqrt(ad_tape *T, ad_tensor *a) { return ad__unary(T, a, AD__U_RSQRT, 0, 0); }
AUTODIFF_API ad_tensor *ad_elu(ad_tape *T, ad_tensor *a, ad_real alpha) { return ad__unary(T, a, AD__U_ELU, alpha, 0); }
/* Whether lo and hi bound a clamp (NaN does not); records op's error when they do not. */
AD__PRIVATE int ad__clamp_bounds(ad_tape *T, const char *op, ad_real lo, ad_real hi)
{
    if (lo <= hi) return 1;
    ad__fail(T, "%s: lower bound %g is above upper bound %g", op, (double)lo, (double)hi);
    return 0;
}

AUTODIFF_API ad_tensor *ad_clamp(ad_tape *T, ad_tensor *a, ad_real lo, ad_real hi)
{
    if (T && a && !ad__clamp_bounds(T, "ad_clamp", lo, hi)) return NULL;
    return ad__unary(T, a, AD__U_CLAMP, lo, hi);
}
AUTODIFF_API ad_tensor *ad_affine(ad_tape *T, ad_tensor *a, ad_real scale, ad_real shift)
{
    return ad__unary(T, a, AD__U_AFFINE, scale, shift);
}
AUTODIFF_API ad_tensor *ad_add_scalar(ad_tape *T, ad_tensor *a, ad_real s)
{
    return ad__unary_as(T, "ad_add_scalar", a, AD__U_AFFINE, 1, s);
}
AUTODIFF_API ad_tensor *ad_sub_scalar(ad_tape *T, ad_tensor *a, ad_real s)
{
    return ad__unary_as(T, "ad_sub_scalar", a, AD__U_AFFINE, 1, -s);
}
AUTODIFF_API ad_tensor *ad_rsub_scalar(ad_tape *T, ad_real s, ad_tensor *a)
{
    return ad__unary_as(T, "ad_rsub_scalar", a, AD__U_AFFINE, -1, s);
}
AUTODIFF_API ad_tensor *ad_mul_scalar(ad_tape *T, ad_tensor *a, ad_real s)
{
    return ad__unary_as(T, "ad_mul_scalar", a, AD__U_AFFINE, s, 0);
}
AUTODIFF_API ad_tensor *ad_div_scalar(ad_tape *T, ad_tensor *a, ad_real s)
{
    if (T && a && s == 0) {
        ad__fail(T, "ad_div_scalar: division by zero");
        return NULL;
    }
    return ad__unary_as(T, "ad_div_scalar", a, AD__U_AFFINE, 1 / s, 0);
}
AUTODIFF_API ad_tensor *ad_maximum_scalar(ad_tape *T, ad_tensor *a, ad_real s)
{
    return ad__unary_as(T, "ad_maximum_scalar", a, AD__U_CLAMP, s, (ad_real)HUGE_VAL);
}
AUTODIFF_API ad_tensor *ad_minimum_scalar(ad_tape *T, ad_tensor *a, ad_real s)
{
    return ad__unary_as(T, "ad_minimum_scalar", a, AD__U_CLAMP, (ad_real)-HUGE_VAL, s);
}

/* >>ops:binary ------------------------------------------------------------------------------- */
/* Ops of two tensors with NumPy broadcasting: one row each.
       ID       the kind, AD__B_<ID>
       NAME     the public function, for errors
       SPLIT    as the unary rows' (ad__unary_split)
       FORWARD  y from the values x (of a) and z (of b), as an expression
       GRAD_A   what a's gradient receives, and GRAD_B b's, in the unary rows' language (see
                >>ops:elementwise) with AD__A, AD__B, AD__Y and the incoming gradient AD__G, and
                the constant masks AD__SHARE_GT(a, b) (1 where a > b, 0.5 where a == b, else 0),
                AD__SHARE_LT and AD__NONZERO_LOG(a) (log a, 0 where a is 0). Expanded on values
                in the fused backward and the one-element backward, and on tensors for sweeps
                that record (where broadcast inputs are summed back to their shapes). A side
                whose formula is AD__G alone passes the gradient on without a copy.
   The two mask rows are the shares of maximum and minimum: never recorded, no gradient. */
#define AD__BINARY_OPS(X)                                                                                  \
    X(ADD, "ad_add", LIGHT, x + z, AD__G, AD__G)                                                           \
    X(SUB, "ad_sub", LIGHT, x - z, AD__G, AD__NEG(AD__G))                                                  \
    X(MUL, "ad_mul", LIGHT, x * z, AD__MUL(AD__G, AD__B), AD__MUL(AD__G, AD__A))                           \
    X(DIV, "ad_div", LIGHT, x / z, AD__DIV(AD__G, AD__B), AD__NEG(AD__DIV(AD__MUL(AD__G, AD__Y), AD__B)))  \
    X(MAX, "ad_maximum", LIGHT, x >= z ? x : z, AD__MUL(AD__G, AD__SHARE_GT(AD__A, AD__B)),                \
      AD__SUB(AD__G, AD__MUL(AD__G, AD__SHARE_GT(AD__A, AD__B))))                                          \
    X(MIN, "ad_minimum", LIGHT, x <= z ? x : z, AD__MUL(AD__G, AD__SHARE_LT(AD__A, AD__B)),                \
      AD__SUB(AD__G, AD__MUL(AD__G, AD__SHARE_LT(AD__A, AD__B))))                                          \
    X(POW, "ad_pow_tensor", HEAVY, AD__F(pow)(x, z),                                                       \
      AD__MUL(AD__G, AD__MUL(AD__B, AD__POWT(AD__A, AD__SUB(AD__B, AD__C(1))))),                           \
      AD__MUL(AD__G, AD__MUL(AD__Y, AD__NONZERO_LOG(AD__A))))                                              \
    X(GT_MASK, "ad_maximum", LIGHT, x > z ? (ad_real)1 : (x == z ? (ad_real)0.5 : (ad_real)0), AD__C(0),   \
      AD__C(0))                                                                                            \
    X(LT_MASK, "ad_minimum", LIGHT, x < z ? (ad_real)1 : (x == z ? (ad_real)0.5 : (ad_real)0), AD__C(0),   \
      AD__C(0))

#define AD__BINARY_ENUM(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B) AD__B_##ID,
enum ad__binary_kind { AD__BINARY_OPS(AD__BINARY_ENUM) AD__B_COUNT };
#undef AD__BINARY_ENUM
#define AD__BINARY_NAME(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B) NAME,
static const char *const ad__binary_names[] = {AD__BINARY_OPS(AD__BINARY_NAME) ""};
#undef AD__BINARY_NAME

/* One element of a binary op. */
AD__INLINE ad_real ad__binary_op(int kind, ad_real x, ad_real z)
{
    switch (kind) {
#define AD__BINARY_CASE(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B) case AD__B_##ID: return (FORWARD);
        AD__BINARY_OPS(AD__BINARY_CASE)
#undef AD__BINARY_CASE
    default: AUTODIFF_ASSERT(0); return 0;
    }
}

/* One row of a binary op. The strides are 1 (a contiguous row) or 0 (a broadcast value); each
   combination of strides and kind gets its own loop so that the compiler vectorises all of them. */
AD__PRIVATE void ad__binary_row(int kind, const ad_real *AD__RESTRICT a, size_t ia,
                                const ad_real *AD__RESTRICT b, size_t ib, ad_real *AD__RESTRICT y,
                                size_t n)
{
    size_t i;
    switch (kind) {
#define AD__BINARY_ROW(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B)                                     \
    case AD__B_##ID:                                                                                 \
        if (ia && ib) {                                                                              \
            for (i = 0; i < n; i++) y[i] = ad__binary_op(AD__B_##ID, a[i], b[i]);                    \
        } else if (ia) {                                                                             \
            ad_real z = b[0];                                                                        \
            for (i = 0; i < n; i++) y[i] = ad__binary_op(AD__B_##ID, a[i], z);                       \
        } else if (ib) {                                                                             \
            ad_real x = a[0];                                                                        \
            for (i = 0; i < n; i++) y[i] = ad__binary_op(AD__B_##ID, x, b[i]);                       \
        } else {                                                                                     \
            ad_real v = ad__binary_op(AD__B_##ID, a[0], b[0]);                                       \
            for (i = 0; i < n; i++) y[i] = v;                                                        \
        }                                                                                            \
        break;
        AD__BINARY_OPS(AD__BINARY_ROW)
#undef AD__BINARY_ROW
    default: AUTODIFF_ASSERT(0);
    }
}

AD__PRIVATE void ad__binary_kernel(int kind, const ad__walk *w, const ad_real *a, const ad_real *b,
                                   ad_real *y)
{
    size_t idx[AD_MAX_DIMS] = {0}, oa = 0, ob = 0, o;
    size_t inner = w->shape[w->ndim - 1], outer = w->total / inner;
    size_t ia = w->sa[w->ndim - 1], ib = w->sb[w->ndim - 1];
    for (o = 0; o < outer; o++) {
        ad__binary_row(kind, a + oa, ia, b + ob, ib, y + o * inner, inner);
        ad__walk_next(w, idx, &oa, &ob);
    }
}

/* The size from which a binary op's loops are split over threads. */
AD__INLINE size_t ad__binary_split(int kind)
{
#define AD__BINARY_SPLIT(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B) AD__SPLIT_##SPLIT,
    static const size_t split[] = {AD__BINARY_OPS(AD__BINARY_SPLIT) 0};
#undef AD__BINARY_SPLIT
    return split[kind];
}

/* NumPy broadcasting of two shapes into out; 0 with the tape's error set when they clash. */
AD__PRIVATE int ad__broadcast_shape(ad_tape *T, const char *op, const ad_tensor *a, const ad_tensor *b,
                                    int *ndim, int *out)
{
    int n = a->ndim > b->ndim ? a->ndim : b->ndim, i;
    for (i = 0; i < n; i++) {
        int da = i < n - a->ndim ? 1 : a->shape[i - (n - a->ndim)];
        int db = i < n - b->ndim ? 1 : b->shape[i - (n - b->ndim)];
        if (da != db && da != 1 && db != 1) {
            char sa[96], sb[96];
            ad__fail(T, "%s: shapes %s and %s cannot be broadcast (dimension %d: %d vs %d)", op,
                     ad_shape_str(a, sa, sizeof sa), ad_shape_str(b, sb, sizeof sb), i, da, db);
            return 0;
        }
        out[i] = da == 1 ? db : da;
    }
    *ndim = n;
    return 1;
}

AD__COLD int ad__check_pair_fail(ad_tape *T, const char *op, const ad_tensor *a, const ad_tensor *b)
{
    return ad__on_tape(T, op, "a", a) && ad__on_tape(T, op, "b", b);
}

AD__HOT int ad__check_pair(ad_tape *T, const char *op, const ad_tensor *a, const ad_tensor *b)
{
    if (a->tape == T && b->tape == T && a->gen == T->gen && b->gen == T->gen) return 1;
    return ad__check_pair_fail(T, op, a, b);
}

/* Computes kind(a, b) with broadcasting; records it when record is set. */
AD__HOT ad_tensor *ad__binary(ad_tape *T, ad_tensor *a, ad_tensor *b, int kind, int record);

/* d (+)= what side `which` (0: a, 1: b) receives, over the values [lo, hi), for operands and
   result of one shape in sweeps that do not record. g_period as in ad__unary_grad_job. */
typedef struct ad__binary_grad_job {
    int kind, which, add;
    const ad_real *a, *b, *y, *g;
    ad_real *d;
    size_t g_period;
} ad__binary_grad_job;

/* the rows' gradient formulas on values: AD__A etc. are the elements at i */
#define AD__DSL_MODE VALUE

AD__PRIVATE void ad__binary_grad_run(const void *ctx, size_t lo, size_t hi, const ad_real *AD__RESTRICT g)
{
    const ad__binary_grad_job *j = (const ad__binary_grad_job *)ctx;
    const ad_real *AD__RESTRICT av = j->a + lo, *AD__RESTRICT bv = j->b + lo;
    const ad_real *AD__RESTRICT yv = j->y + lo;
    ad_real *AD__RESTRICT d = j->d + lo;
    size_t i, size = hi - lo;
    int add = j->add;
    (void)av;
    (void)bv;
    (void)yv;
/* one element (scalar tapes) gets no loop */
#define AD__BINARY_FUSED_SIDE(EXPR)                                                                  \
    if (size == 1) { i = 0; if (add) d[0] += (EXPR); else d[0] = (EXPR); }                           \
    else if (add) for (i = 0; i < size; i++) d[i] += (EXPR);                                         \
    else for (i = 0; i < size; i++) d[i] = (EXPR);
#define AD__BINARY_FUSED(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B)                                   \
    case AD__B_##ID * 2: AD__BINARY_FUSED_SIDE(GRAD_A) break;                                        \
    case AD__B_##ID * 2 + 1: AD__BINARY_FUSED_SIDE(GRAD_B) break;
    switch (j->kind * 2 + j->which) {
        AD__BINARY_OPS(AD__BINARY_FUSED)
    default: AUTODIFF_ASSERT(0);
    }
#undef AD__BINARY_FUSED
#undef AD__BINARY_FUSED_SIDE
}

AD__PRIVATE void ad__binary_grad_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__binary_grad_job *j = (const ad__binary_grad_job *)ctx;
    ad__grad_runs(ad__binary_grad_run, ctx, lo, hi, j->g, j->g_period);
}

/* One-element operands of the same shape (scalar tapes): the output and its entry are one block,
   and the backward goes straight to the inputs' gradient values with the same formulas. */
AD__PRIVATE void ad__binary_backward(ad__sweep *S, ad__node *n, ad_tensor *g);

/* What the inputs of a one-element entry receive (*da, *db) from g_value, its output's
   gradient. */
AD__HOT void ad__binary_one_derivs(const ad__node *n, ad_real g_value, ad_real *da, ad_real *db)
{
    const ad_real *av = n->in[0]->data, *bv = n->in[1]->data, *yv = n->out->data, *g = &g_value;
    size_t i = 0;
    (void)av;
    (void)bv;
    (void)yv;
    (void)g;
    (void)i;
    switch (n->st.binary.kind) {
#define AD__BINARY_ONE(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B)                                     \
    case AD__B_##ID: *da = (GRAD_A); *db = (GRAD_B); break;
        AD__BINARY_OPS(AD__BINARY_ONE)
#undef AD__BINARY_ONE
    default: AUTODIFF_ASSERT(0); *da = *db = 0;
    }
}

/* The inputs' gradients of a one-element entry, from g_value, its output's. (The inputs' ids
   are below S->n: the entry was recorded before the sweep began.) */
AD__PRIVATE void ad__binary_one_grads(ad__sweep *S, ad__node *n, ad_real g_value)
{
    ad_real da, db;
    ad__binary_one_derivs(n, g_value, &da, &db);
    if (n->in[0]->requires_grad) ad__accum_one(S, n->in[0], da);
    if (n->in[1]->requires_grad) ad__accum_one(S, n->in[1], db);
}

/* The same for the one-element binary ops (see ad__unary_backward_one). */
AD__PRIVATE void ad__binary_backward_one(ad__sweep *S, ad__node *n, ad_tensor *gt)
{
    if (S->create_graph) ad__binary_backward(S, n, gt);
    else ad__binary_one_grads(S, n, gt->data[0]);
}

#undef AD__DSL_MODE

/* Whether a side's formula is AD__G alone: every other word reads as 0 here. */
#define AD__DSL_MODE PASSES
AD__INLINE int ad__binary_passes_g(int kind, int which)
{
#define AD__BINARY_PASSES(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B) {GRAD_A, GRAD_B},
    static const unsigned char passes[][2] = {AD__BINARY_OPS(AD__BINARY_PASSES) {0, 0}};
#undef AD__BINARY_PASSES
    return passes[kind][which];
}
#undef AD__DSL_MODE

/* The inputs' gradients (those wanted: wa, wb) in one pass each when nothing was broadcast;
   for sweeps that do not record. Where the gradient is g itself (a sum, the left side of a
   difference) the input shares g's buffer until a second contribution arrives. */
AD__PRIVATE void ad__binary_backward_fused(ad__sweep *S, ad__node *n, ad_tensor *gt, int wa, int wb)
{
    enum { PERIOD = 1024 };
    ad_real repeated[PERIOD];
    ad__binary_grad_job job;
    int uniform = S->owned[n->out->id] == AD__GRAD_UNIFORM;
    job.kind = n->st.binary.kind;
    job.a = n->in[0]->data;
    job.b = n->in[1]->data;
    job.y = n->out->data;
    job.g = ad__grad_source(S, n, gt, repeated, PERIOD, &job.g_period);
    for (job.which = 0; job.which < 2; job.which++) {
        if (!(job.which ? wb : wa)) continue;
        if (ad__binary_passes_g(job.kind, job.which)) {
            if (uniform && ad__grad_uniform(S, n->in[job.which], gt->data[0])) continue;
            if (uniform) {
                if (!(gt = ad__grad_spread(S, n->out))) return;
                uniform = 0;
                job.g = gt->data;
                job.g_period = 0;
            }
            ad__accum(S, n->in[job.which], gt, 0);
            continue;
        }
        job.d = ad__grad_target(S, n->in[job.which], &job.add);
        if (!job.d) return;
        ad__parallel_range(S->T, ad__binary_grad_range, &job, n->out->size, ad__binary_split(job.kind),
                           AD__STORE_BLOCK);
    }
}

/* the rows' gradient formulas on tensors, recorded */
#define AD__DSL_MODE TENSOR

/* What side `which` of kind(a, b) receives from g, recorded. */
AD__PRIVATE ad_tensor *ad__binary_grad_recorded(ad_tape *T, int kind, int which, ad_tensor *a, ad_tensor *b,
                                                ad_tensor *y, ad_tensor *g)
{
    (void)a;
    (void)b;
    (void)y;
    switch (kind * 2 + which) {
#define AD__BINARY_RECORDED(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B)                                \
    case AD__B_##ID * 2: return GRAD_A;                                                              \
    case AD__B_##ID * 2 + 1: return GRAD_B;
        AD__BINARY_OPS(AD__BINARY_RECORDED)
#undef AD__BINARY_RECORDED
    default: AUTODIFF_ASSERT(0); return NULL;
    }
}
#undef AD__DSL_MODE

AD__PRIVATE void ad__binary_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *in[2];
    int want[2], which, kind = n->st.binary.kind;
    in[0] = n->in[0];
    in[1] = n->in[1];
    want[0] = ad__wants(S, in[0]);
    want[1] = ad__wants(S, in[1]);
    if (!S->create_graph && in[0]->size == n->out->size && in[1]->size == n->out->size) {
        ad__binary_backward_fused(S, n, g, want[0], want[1]);
        return;
    }
    /* here it takes g's shape: an operand that passes g on may have been broadcast, and then
       sums it over the broadcast axes */
    if (S->owned[n->out->id] == AD__GRAD_UNIFORM && !(g = ad__grad_spread(S, n->out))) return;
    for (which = 0; which < 2; which++) {
        if (!want[which]) continue;
        if (ad__binary_passes_g(kind, which)) ad__accum_to(S, in[which], g, 0);
        else ad__accum_to(S, in[which], ad__binary_grad_recorded(S->T, kind, which, in[0], in[1], n->out, g), 1);
    }
}

/* The anomaly check of a one-element result (see ad__record). */
AD__COLD ad_tensor *ad__anomaly_binary_one(ad_tape *T, ad_tensor *a, ad_tensor *b, ad_tensor *y, int kind)
{
    ad_tensor *ins[2];
    ins[0] = a;
    ins[1] = b;
    return ad__anomaly_forward(T, ad__binary_names[kind], y, ins, 2, &T->sink) ? y : NULL;
}

/* kind(a, b) of one-element operands of one shape (scalar tapes): the result and its entry in
   one block. */
AD__HOT ad_tensor *ad__binary_one(ad_tape *T, const char *op, ad_tensor *a, ad_tensor *b, int kind,
                                  int record)
{
    int recorded = record && T->grad_enabled && (a->requires_grad || b->requires_grad);
    unsigned char *block = ad__one_block(T, op, recorded);
    ad_tensor *y = (ad_tensor *)block;
    ad__node *n;
    if (!block) return NULL;
    ad__tensor_init(T, y, a->ndim, a->shape, 1, (ad_real *)(block + AD__ONE_HEADER_BYTES));
    y->data[0] = ad__binary_op(kind, a->data[0], b->data[0]);
    if (!recorded) return T->anomaly ? ad__anomaly_binary_one(T, a, b, y, kind) : y;
    n = (ad__node *)(block + AD__ONE_ENTRY_OFFSET);
    ad__link_entry(T, n, y, ad__binary_backward_one, 2);
    n->reads_held = AD__GRAD_VALUE;
    n->in[0] = a;
    n->in[1] = b;
    n->st.binary.kind = kind;
    return T->anomaly ? ad__anomaly_binary_one(T, a, b, y, kind) : y;
}

/* y = kind(a, b) for operands of y's size, split over the tape's threads for large tensors */
typedef struct ad__binary_job {
    int kind;
    const ad_real *a, *b;
    ad_real *y;
} ad__binary_job;

AD__PRIVATE void ad__binary_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__binary_job *j = (const ad__binary_job *)ctx;
    ad__binary_row(j->kind, j->a + lo, 1, j->b + lo, 1, j->y + lo, hi - lo);
}

AD__PRIVATE void ad__binary_same(ad_tape *T, int kind, const ad_tensor *a, const ad_tensor *b, ad_tensor *y)
{
    ad__binary_job job;
    job.kind = kind;
    job.a = a->data;
    job.b = b->data;
    job.y = y->data;
    ad__parallel_range(T, ad__binary_range, &job, y->size, AD__SPLIT_LIGHT, AD__STORE_BLOCK);
}

/* kind(a, b) for operands of different shapes: the broadcast output, computed by walking it. */
AD__PRIVATE ad_tensor *ad__binary_broadcast(ad_tape *T, const char *op, const ad_tensor *a,
                                            const ad_tensor *b, int kind)
{
    int shape[AD_MAX_DIMS], ndim;
    ad__walk w;
    ad_tensor *y;
    if (!ad__broadcast_shape(T, op, a, b, &ndim, shape)) return NULL;
    y = ad__tensor(T, op, ndim, shape, 1);
    if (!y) return NULL;
    if (a->size == y->size && b->size == y->size) {
        ad__binary_same(T, kind, a, b, y);
    } else {
        ad__walk_init(&w, y->ndim, y->shape, a, b);
        ad__binary_kernel(kind, &w, a->data, b->data, y->data);
    }
    return y;
}

/* kind(a, b) for operands that are not both one element; records it when record is set. */
AD__PRIVATE ad_tensor *ad__binary_tensors(ad_tape *T, const char *op, ad_tensor *a, ad_tensor *b, int kind,
                                          int record)
{
    ad_tensor *y;
    ad__node *n;
    if (ad__same_shape(a, b)) {
        y = ad__like(T, op, a);
        if (!y) return NULL;
        ad__binary_same(T, kind, a, b, y);
    } else {
        y = ad__binary_broadcast(T, op, a, b, kind);
        if (!y) return NULL;
    }
    if (!record) return y;
    n = ad__record2(T, op, y, ad__binary_backward, a, b);
    if (!n) return NULL;
    n->reads_held = AD__GRAD_UNIFORM;
    n->st.binary.kind = kind;
    return y;
}

AD__HOT ad_tensor *ad__binary(ad_tape *T, ad_tensor *a, ad_tensor *b, int kind, int record)
{
    const char *op = ad__binary_names[kind];
    if (!T || !a || !b) return NULL;
    if (!ad__check_pair(T, op, a, b)) return NULL;
    if (a->size == 1 && b->size == 1 && a->ndim == b->ndim) return ad__binary_one(T, op, a, b, kind, record);
    return ad__binary_tensors(T, op, a, b, kind, record);
}

AUTODIFF_API ad_tensor *ad_add(ad_tape *T, ad_tensor *a, ad_tensor *b) { return ad__binary(T, a, b, AD__B_ADD, 1); }
AUTODIFF_API ad_tensor *ad_sub(ad_tape *T, ad_tensor *a, ad_tensor *b) { return ad__binary(T, a, b, AD__B_SUB, 1); }
AUTODIFF_API ad_tensor *ad_mul(ad_tape *T, ad_tensor *a, ad_tensor *b) { return ad__binary(T, a, b, AD__B_MUL, 1); }
AUTODIFF_API ad_tensor *ad_div(ad_tape *T, ad_tensor *a, ad_tensor *b) { return ad__binary(T, a, b, AD__B_DIV, 1); }
AUTODIFF_API ad_tensor *ad_maximum(ad_tape *T, ad_tensor *a, ad_tensor *b) { return ad__binary(T, a, b, AD__B_MAX, 1); }
AUTODIFF_API ad_tensor *ad_minimum(ad_tape *T, ad_tensor *a, ad_tensor *b) { return ad__binary(T, a, b, AD__B_MIN, 1); }
AUTODIFF_API ad_tensor *ad_pow_tensor(ad_tape *T, ad_tensor *a, ad_tensor *b) { return ad__binary(T, a, b, AD__B_POW, 1); }

/* >>ops:numbers ------------------------------------------------------------------------------ */
/* The lean tape for single numbers (>>api:numbers). A number's id is the tape's base plus its
   place; place 0 stands for every constant, so that an entry always names two places and the
   sweep needs no test for a missing input (what reaches place 0 is never read). Each reset moves
   the base past the places used, so ids of earlier generations fall outside the range
   [base, base + count) that an op accepts. Ops take their local derivatives from the
   elementwise and binary tables' rows on values, with the incoming gradient 1. */

/* The first base of T's numbers: scattered by T's address, so that two tapes' ranges of ids
   seldom meet; at most 2^30, and 2^31 bounds the base (ad__nums_reset) and the places
   (ad__nums_grow), so that no id reaches 2^32 and 0 is never an id. */
AD__INLINE unsigned ad__nums_first_base(const ad_tape *T)
{
    return (unsigned)((((uintptr_t)T >> 4) * 2654435761u) & 0x3fffffffu) + 1;
}

AD__PRIVATE void ad__nums_init(ad_tape *T)
{
    T->nums.base = ad__nums_first_base(T);
    T->nums.count = 1;
}

AD__PRIVATE void ad__nums_reset(ad__nums *N)
{
    uint64_t next = (uint64_t)N->base + N->count;
    N->base = next > 0x80000000u ? 1 : (unsigned)next;
    N->count = 1;
    N->swept = 0;
}

AD__INLINE ad_num ad__num_make(ad_real value, unsigned id)
{
    ad_num y;
    y.value = value;
    y.id = id;
    return y;
}

/* What a failed call returns: no tape accepts id 0. */
AD__INLINE ad_num ad__num_failed(void) { return ad__num_make((ad_real)NAN, 0); }

/* Room for twice the places (64 at first), keeping the entries and the last sweep's
   gradients; 0 with the error recorded when memory runs out. */
AD__COLD int ad__nums_grow(ad_tape *T, const char *op)
{
    ad__nums *N = &T->nums;
    const size_t per_place = sizeof(ad__num_entry) + sizeof(ad__num_grad);
    size_t cap = N->cap ? 2 * (size_t)N->cap : 64;
    unsigned char *block;
    ad__nums grown = *N;
    if (cap > 0x80000000u || cap > (size_t)-1 / per_place ||
        !(block = (unsigned char *)AUTODIFF_MALLOC(cap * per_place))) {
        ad__fail(T, "%s: out of memory recording the number", op);
        return 0;
    }
    grown.entries = (ad__num_entry *)block;
    grown.grads = (ad__num_grad *)(block + cap * sizeof(ad__num_entry));
    memset(grown.grads, 0, cap * sizeof(ad__num_grad)); /* no sweep is numbered 0 */
    grown.cap = (unsigned)cap;
    grown.entries[0].a = grown.entries[0].b = 0;
    grown.entries[0].da = grown.entries[0].db = 0;
    if (N->cap) {
        memcpy(grown.entries, N->entries, N->count * sizeof(ad__num_entry));
        memcpy(grown.grads, N->grads, N->swept * sizeof(ad__num_grad));
    }
    AUTODIFF_FREE(N->entries);
    *N = grown;
    return 1;
}

/* Records the refusal of x, an operand of op named what, and returns a failed number. No
   message for a failed number, which carries an earlier error on (the tape has it). */
AD__COLD ad_num ad__num_refuse(ad_tape *T, const char *op, const char *what)
{
    if (!T->has_error)
        ad__fail(T, "%s: %s is not a number of this tape (made before its last reset, on another tape, "
                    "or by a call that failed)", op, what);
    return ad__num_failed();
}

/* Whether x is on T, with its place. */
AD__HOT int ad__num_at(const ad_tape *T, ad_num x, unsigned *place)
{
    *place = (unsigned)x.id - T->nums.base;
    return *place < T->nums.count;
}

AD__COLD ad_num ad__num_push_grown(ad_tape *T, const char *op, ad_real value, unsigned a, ad_real da,
                                   unsigned b, ad_real db);

/* Records a number of the given value whose inputs are at places a and b with the local
   derivatives da and db. The rare paths are calls in tail position, so that the common one
   saves no registers. */
AD__HOT ad_num ad__num_push(ad_tape *T, const char *op, ad_real value, unsigned a, ad_real da, unsigned b,
                            ad_real db)
{
    ad__nums *N = &T->nums;
    unsigned place = N->count;
    ad__num_entry *e;
    if (place >= N->cap) return ad__num_push_grown(T, op, value, a, da, b, db);
    e = N->entries + place;
    e->a = a;
    e->b = b;
    e->da = da;
    e->db = db;
    N->count = place + 1;
    return ad__num_make(value, N->base + place);
}

AD__COLD ad_num ad__num_push_grown(ad_tape *T, const char *op, ad_real value, unsigned a, ad_real da,
                                   unsigned b, ad_real db)
{
    if (!ad__nums_grow(T, op)) return ad__num_failed();
    return ad__num_push(T, op, value, a, da, b, db);
}

/* An op's result: recorded when an input is not a constant and recording is on, else a
   constant, as the tensor ops record nothing for inputs without gradients or in no-grad mode. */
AD__HOT ad_num ad__num_result(ad_tape *T, const char *op, ad_real value, unsigned a, ad_real da, unsigned b,
                              ad_real db)
{
    if ((a | b) == 0 || !T->grad_enabled) return ad__num_make(value, T->nums.base);
    return ad__num_push(T, op, value, a, da, b, db);
}

AUTODIFF_API ad_num ad_num_var(ad_tape *T, ad_real value)
{
    if (!T) return ad__num_failed();
    return ad__num_push(T, "ad_num_var", value, 0, 0, 0, 0);
}

AUTODIFF_API ad_num ad_num_const(ad_tape *T, ad_real value)
{
    if (!T) return ad__num_failed();
    return ad__num_make(value, T->nums.base);
}

AUTODIFF_API int ad_num_ok(ad_num x) { return x.id != 0; }

AUTODIFF_API size_t ad_num_count(const ad_tape *T) { return T ? T->nums.count - 1 : 0; }

#define AD__DSL_MODE VALUE

/* kind(x) with its parameters, and the derivative from the row, on values (always inlined:
   each public function below gets the row of its constant kind alone). */
AD__HOT ad_num ad__num_unary(ad_tape *T, const char *op, ad_num a, int kind, ad_real p0, ad_real p1)
{
    const ad_real one = 1, *g = &one, *xv = &a.value, *yv;
    ad_real x = a.value, y, d;
    unsigned place;
    size_t i = 0;
    (void)g;
    (void)p1;
    if (!T) return ad__num_failed();
    if (!ad__num_at(T, a, &place)) return ad__num_refuse(T, op, "the input");
    yv = &y;
    switch (kind) {
#define AD__NUM_UNARY(ID, NAME, SPLIT, FORWARD, DERIV)                                               \
    case AD__U_##ID:                                                                                 \
        y = (FORWARD);                                                                               \
        d = (DERIV);                                                                                 \
        break;
        AD__UNARY_OPS(AD__NUM_UNARY)
#undef AD__NUM_UNARY
    default: AUTODIFF_ASSERT(0); y = d = 0;
    }
    (void)xv;
    (void)yv;
    (void)i;
    return ad__num_result(T, op, y, place, d, 0, 0);
}

/* kind(a, b), and what each side receives from an incoming gradient of 1. */
AD__HOT ad_num ad__num_binary(ad_tape *T, const char *op, ad_num a, ad_num b, int kind)
{
    const ad_real one = 1, *g = &one, *av = &a.value, *bv = &b.value, *yv;
    ad_real y, da, db;
    unsigned pa, pb;
    size_t i = 0;
    if (!T) return ad__num_failed();
    if (!ad__num_at(T, a, &pa)) return ad__num_refuse(T, op, "a");
    if (!ad__num_at(T, b, &pb)) return ad__num_refuse(T, op, "b");
    y = ad__binary_op(kind, a.value, b.value);
    yv = &y;
    switch (kind) {
#define AD__NUM_BINARY(ID, NAME, SPLIT, FORWARD, GRAD_A, GRAD_B)                                     \
    case AD__B_##ID: da = (GRAD_A); db = (GRAD_B); break;
        AD__BINARY_OPS(AD__NUM_BINARY)
#undef AD__NUM_BINARY
    default: AUTODIFF_ASSERT(0); da = db = 0;
    }
    (void)g;
    (void)av;
    (void)bv;
    (void)yv;
    (void)i;
    return ad__num_result(T, op, y, pa, da, pb, db);
}
#undef AD__DSL_MODE

/* The number of a new sweep, which marks the places it reaches: marks of earlier sweeps need no
   clearing. When the count wraps, every mark is cleared once. */
AD__INLINE unsigned ad__nums_next_sweep(ad__nums *N)
{
    if (++N->sweep == 0) {
        memset(N->grads, 0, (size_t)N->cap * sizeof(ad__num_grad));
        N->sweep = 1;
    }
    return N->sweep;
}

/* Passes c to a place: the first to arrive in this sweep is stored, with the sweep's number, and
   later ones are added, so that one contribution arrives bit for bit (as in the tensors' sweep)
   and no gradient needs clearing before a sweep. */
AD__INLINE void ad__num_pass(ad__num_grad *place, ad_real c, unsigned sweep)
{
    if (place->sweep == sweep) {
        place->value += c;
    } else {
        place->value = c;
        place->sweep = sweep;
    }
}

/* The sweep: from y's place down, each place this sweep reached passes its gradient times the
   local derivatives to its inputs. Places not reached pass nothing, so a derivative that is
   infinite where no route leads adds no NaN. What entry i passes to place i - 1, the usual
   case, stays in a register (carry) until the loop gets there. ad_num_var's entries have no
   inputs and pass nothing. */
AUTODIFF_API int ad_num_backward(ad_tape *T, ad_num y)
{
    ad__nums *N;
    const ad__num_entry *e;
    ad__num_grad *grads;
    unsigned top, i, sweep;
    ad_real carry = 0;
    int carried = 0; /* whether carry holds a contribution to place i */
    if (!T) return -1;
    if (!ad__num_at(T, y, &top)) {
        ad__num_refuse(T, "ad_num_backward", "y");
        return -1;
    }
    N = &T->nums;
    if (top == 0) { /* a constant: every gradient is 0 */
        N->swept = 0;
        return 0;
    }
    e = N->entries;
    grads = N->grads;
    sweep = ad__nums_next_sweep(N);
    grads[top].value = 1;
    grads[top].sweep = sweep;
    for (i = top; i > 0; i--) {
        const ad__num_entry *en = e + i;
        ad__num_grad *here = grads + i;
        ad_real gi, ca, cb;
        if (carried) {
            gi = here->sweep == sweep ? here->value + carry : carry;
            here->value = gi;
            here->sweep = sweep;
            carried = 0;
        } else if (here->sweep == sweep) {
            gi = here->value;
        } else {
            continue;
        }
        if ((en->a | en->b) == 0) continue; /* a variable */
        ca = en->da * gi;
        cb = en->db * gi;
        if (en->a == i - 1) {
            carry = ca;
            carried = 1;
        } else {
            ad__num_pass(grads + en->a, ca, sweep);
        }
        if (en->b == i - 1) {
            carry = carried ? carry + cb : cb;
            carried = 1;
        } else {
            ad__num_pass(grads + en->b, cb, sweep);
        }
    }
    N->swept = top + 1;
    return 0;
}

AUTODIFF_API ad_real ad_num_grad(ad_tape *T, ad_num x)
{
    unsigned place;
    if (!T) return (ad_real)NAN;
    if (!ad__num_at(T, x, &place)) return ad__num_refuse(T, "ad_num_grad", "x").value;
    if (place == 0 || place >= T->nums.swept || T->nums.grads[place].sweep != T->nums.sweep) return 0;
    return T->nums.grads[place].value;
}

AUTODIFF_API ad_num ad_num_add(ad_tape *T, ad_num a, ad_num b) { return ad__num_binary(T, "ad_num_add", a, b, AD__B_ADD); }
AUTODIFF_API ad_num ad_num_sub(ad_tape *T, ad_num a, ad_num b) { return ad__num_binary(T, "ad_num_sub", a, b, AD__B_SUB); }
AUTODIFF_API ad_num ad_num_mul(ad_tape *T, ad_num a, ad_num b) { return ad__num_binary(T, "ad_num_mul", a, b, AD__B_MUL); }
AUTODIFF_API ad_num ad_num_div(ad_tape *T, ad_num a, ad_num b) { return ad__num_binary(T, "ad_num_div", a, b, AD__B_DIV); }
AUTODIFF_API ad_num ad_num_maximum(ad_tape *T, ad_num a, ad_num b) { return ad__num_binary(T, "ad_num_maximum", a, b, AD__B_MAX); }
AUTODIFF_API ad_num ad_num_minimum(ad_tape *T, ad_num a, ad_num b) { return ad__num_binary(T, "ad_num_minimum", a, b, AD__B_MIN); }
AUTODIFF_API ad_num ad_num_pow_num(ad_tape *T, ad_num a, ad_num b) { return ad__num_binary(T, "ad_num_pow_num", a, b, AD__B_POW); }

AUTODIFF_API ad_num ad_num_neg(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_neg", x, AD__U_NEG, 0, 0); }
AUTODIFF_API ad_num ad_num_exp(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_exp", x, AD__U_EXP, 0, 0); }
AUTODIFF_API ad_num ad_num_log(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_log", x, AD__U_LOG, 0, 0); }
AUTODIFF_API ad_num ad_num_sin(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_sin", x, AD__U_SIN, 0, 0); }
AUTODIFF_API ad_num ad_num_cos(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_cos", x, AD__U_COS, 0, 0); }
AUTODIFF_API ad_num ad_num_tanh(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_tanh", x, AD__U_TANH, 0, 0); }
AUTODIFF_API ad_num ad_num_sigmoid(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_sigmoid", x, AD__U_SIGMOID, 0, 0); }
AUTODIFF_API ad_num ad_num_relu(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_relu", x, AD__U_RELU, 0, 0); }
AUTODIFF_API ad_num ad_num_leaky_relu(ad_tape *T, ad_num x, ad_real slope)
{
    return ad__num_unary(T, "ad_num_leaky_relu", x, AD__U_LEAKY_RELU, slope, 0);
}
AUTODIFF_API ad_num ad_num_gelu(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_gelu", x, AD__U_GELU, 0, 0); }
AUTODIFF_API ad_num ad_num_sqrt(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_sqrt", x, AD__U_SQRT, 0, 0); }
AUTODIFF_API ad_num ad_num_abs(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_abs", x, AD__U_ABS, 0, 0); }
AUTODIFF_API ad_num ad_num_square(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_square", x, AD__U_SQUARE, 0, 0); }
AUTODIFF_API ad_num ad_num_pow(ad_tape *T, ad_num x, ad_real p) { return ad__num_unary(T, "ad_num_pow", x, AD__U_POW, p, 0); }
AUTODIFF_API ad_num ad_num_log1p(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_log1p", x, AD__U_LOG1P, 0, 0); }
AUTODIFF_API ad_num ad_num_expm1(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_expm1", x, AD__U_EXPM1, 0, 0); }
AUTODIFF_API ad_num ad_num_softplus(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_softplus", x, AD__U_SOFTPLUS, 0, 0); }
AUTODIFF_API ad_num ad_num_silu(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_silu", x, AD__U_SILU, 0, 0); }
AUTODIFF_API ad_num ad_num_erf(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_erf", x, AD__U_ERF, 0, 0); }
AUTODIFF_API ad_num ad_num_atan(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_atan", x, AD__U_ATAN, 0, 0); }
AUTODIFF_API ad_num ad_num_reciprocal(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_reciprocal", x, AD__U_RECIPROCAL, 0, 0); }
AUTODIFF_API ad_num ad_num_rsqrt(ad_tape *T, ad_num x) { return ad__num_unary(T, "ad_num_rsqrt", x, AD__U_RSQRT, 0, 0); }
AUTODIFF_API ad_num ad_num_elu(ad_tape *T, ad_num x, ad_real alpha) { return ad__num_unary(T, "ad_num_elu", x, AD__U_ELU, alpha, 0); }
AUTODIFF_API ad_num ad_num_clamp(ad_tape *T, ad_num x, ad_real lo, ad_real hi)
{
    if (T && !ad__clamp_bounds(T, "ad_num_clamp", lo, hi)) return ad__num_failed();
    return ad__num_unary(T, "ad_num_clamp", x, AD__U_CLAMP, lo, hi);
}
AUTODIFF_API ad_num ad_num_affine(ad_tape *T, ad_num x, ad_real scale, ad_real shift)
{
    return ad__num_unary(T, "ad_num_affine", x, AD__U_AFFINE, scale, shift);
}

/* >>ops:reduce ------------------------------------------------------------------------------- */
/* Reductions along one axis, or over the whole tensor (axis -1): one row each of
   AD__REDUCE_OPS, naming the two functions that are the op, written below in the table's order:
   FORWARD   fills j->d ([outer, inner]) from j->x viewed as [outer, n, inner], with the row's
             setting j->param, splitting the planes over the tape's threads as suits its cost;
   BACKWARD  an ad__backward_fn that adds x's gradient from the result's, fused where it can be
             and built from ops when the sweep records (create_graph).
   ad__reduce does the rest for every row: the checks, the result's shape (keepdim) and the
   entry, whose ad__reduce_state keeps the row, the axis and the setting. Rows without a public
   whole-tensor form are only reduced along an axis.
   The kernels go through panels of up to AD__PANEL neighbouring columns at once, keeping a
   running value per column, so a reduction over a middle axis still reads whole rows. Every
   value is computed by the same code in the same order whatever the split over threads. */
#define AD__REDUCE_OPS(X)                                                                        \
    /* ID         FORWARD                 BACKWARD               setting (param)      */        \
    X(SUM,        ad__sum_forward,        ad__sum_backward)      /* 1                 */        \
    X(MEAN,       ad__sum_forward,        ad__sum_backward)      /* 1 / n             */        \
    X(MAX,        ad__extreme_forward,    ad__extreme_backward)                                 \
    X(MIN,        ad__extreme_forward,    ad__extreme_backward)                                 \
    X(LOGSUMEXP,  ad__logsumexp_forward,  ad__logsumexp_backward)                               \
    X(VAR,        ad__var_forward,        ad__var_backward)      /* n - correction    */        \
    X(STD,        ad__var_forward,        ad__var_backward)      /* n - correction    */        \
    X(PROD,       ad__prod_forward,       ad__prod_backward)

#define AD__REDUCE_ENUM(ID, FORWARD, BACKWARD) AD__R_##ID,
enum ad__reduce_kind { AD__REDUCE_OPS(AD__REDUCE_ENUM) AD__R_COUNT };
#undef AD__REDUCE_ENUM

AD__INLINE size_t ad__plane_block(size_t values); /* >>ops:index */

/* Resolves a possibly negative axis; -1 with the tape's error set when out of range. */
AD__PRIVATE int ad__axis(ad_tape *T, const char *op, const ad_tensor *a, int axis)
{
    int r = axis < 0 ? axis + a->ndim : axis;
    if (r < 0 || r >= a->ndim) {
        char s[96];
        ad__fail(T, "%s: axis %d is out of range for shape %s", op, axis, ad_shape_str(a, s, sizeof s));
        return -1;
    }
    return r;
}

/* Checks a and resolves axis for op; -1 (error set) when either is wrong. */
AD__PRIVATE int ad__axis_of(ad_tape *T, const char *op, const ad_tensor *a, int axis)
{
    if (!ad__on_tape(T, op, "the input", a)) return -1;
    return ad__axis(T, op, a, axis);
}

/* The shape of a reduced along axis (every axis when it is -1): without it, or with it as 1
   when keepdim is set. */
AD__PRIVATE int ad__reduced_shape(const ad_tensor *a, int axis, int keepdim, int *shape)
{
    int i, ndim = 0;
    for (i = 0; i < a->ndim; i++) {
        if (axis >= 0 && i != axis) shape[ndim++] = a->shape[i];
        else if (keepdim) shape[ndim++] = 1;
    }
    return ndim;
}

/* A reduction's gradient is read in a's shape with the axis kept as 1, where it broadcasts. */
AD__PRIVATE ad_tensor *ad__kept(ad_tape *T, ad_tensor *g, const ad_tensor *a, int axis)
{
    int shape[AD_MAX_DIMS];
    ad__reduced_shape(a, axis, 1, shape);
    return ad_reshape(T, g, a->ndim, shape);
}

/* x viewed as [outer, n, inner] around axis; the whole of x as one run when axis is -1. */
AD__PRIVATE void ad__reduce_view(const ad_tensor *x, int axis, size_t *outer, size_t *n, size_t *inner)
{
    if (axis >= 0) {
        ad__split_axis(x, axis, outer, n, inner);
    } else {
        *outer = *inner = 1;
        *n = x->size;
    }
}

/* One run of a kernel over x viewed as [outer, n, inner]: y and g are a reduction's result and
   its gradient ([outer, inner]); d is where the kernel writes (the result, or x's gradient),
   adding into it when add is set. */
typedef struct ad__axis_job {
    const ad_real *x, *y, *g;
    ad_real *d;
    size_t n, inner;
    ad_real param;   /* a reduction's setting (ad__reduce_state.param) */
    int kind;        /* a reduction's row */
    int flag;        /* ad_cumsum: 1 sums from the end */
    int add;
} ad__axis_job;

/* Runs fn over the `outer` planes of job on the tape's threads from `split` values on
   (AD__SPLIT_HEAVY for an exp per value, AD__SPLIT_LIGHT for less), in runs of planes whose
   `written` values each make whole blocks. */
AD__PRIVATE void ad__axis_split(ad_tape *T, ad__range_fn fn, const ad__axis_job *job, size_t outer, size_t split,
                                size_t written)
{
    size_t values = job->n * job->inner;
    ad__parallel_range(T, fn, job, outer, (split + values - 1) / values, ad__plane_block(written));
}

/* ---- sum and mean: y = param * (the sum of the slice), param 1 / n for a mean; the gradient
   is g * param, broadcast back over the slice. */
/* A sum of one long run is cut into chunks whose length depends on n alone (at least
   AD__SUM_CHUNK values, at most AD__SUM_CHUNKS chunks), each summed by ad__sum_run, and the
   chunks' sums added in order: threads take chunks, and the result is the same for any thread
   count. */
#define AD__SUM_CHUNK ((size_t)1 << 15)
#define AD__SUM_CHUNKS 256

/* The length of the chunks of a run of n values (the gradient norm of ad_clip_grad_norm is cut
   the same way) */
AD__INLINE size_t ad__sum_chunk_length(size_t n)
{
    size_t chunk = (n + AD__SUM_CHUNKS - 1) / AD__SUM_CHUNKS;
    return chunk < AD__SUM_CHUNK ? AD__SUM_CHUNK : chunk;
}

typedef struct ad__sum_job {
    const ad_real *x;
    ad_real *y;        /* one sum per row, or per chunk */
    size_t n, chunk;   /* values per row, or in the run; values per chunk */
    ad_real scale;
} ad__sum_job;

/* the sums of the rows [lo, hi), times scale */
AD__PRIVATE void ad__sum_rows_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__sum_job *j = (const ad__sum_job *)ctx;
    ad__reduce_sum(j->x + lo * j->n, j->y + lo, hi - lo, j->n, 1, j->scale);
}

/* the sums of the chunks [lo, hi) of the run */
AD__PRIVATE void ad__sum_chunks_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__sum_job *j = (const ad__sum_job *)ctx;
    size_t c;
    for (c = lo; c < hi; c++) {
        size_t at = c * j->chunk;
        j->y[c] = ad__sum_run(j->x + at, j->n - at < j->chunk ? j->n - at : j->chunk);
    }
}

/* ad__reduce_sum on the tape's threads from AD__SPLIT_LIGHT values: the rows of a sum over the
   last axis split between them, one long run (a sum of everything) in chunks; a sum over
   another axis on the calling thread. */
AD__PRIVATE void ad__reduce_sum_split(ad_tape *T, const ad_real *x, ad_real *y, size_t outer, size_t n,
                                      size_t inner, ad_real scale)
{
    ad__sum_job job;
    job.x = x;
    job.y = y;
    job.n = n;
    job.scale = scale;
    if (inner == 1 && outer == 1 && n > AD__SUM_CHUNK) {
        ad_real part[AD__SUM_CHUNKS], s = 0;
        size_t chunks, c;
        job.chunk = ad__sum_chunk_length(n);
        chunks = (n + job.chunk - 1) / job.chunk;
        job.y = part;
        ad__parallel_range(T, ad__sum_chunks_range, &job, chunks, n >= AD__SPLIT_LIGHT ? 2 : chunks + 1, 1);
        for (c = 0; c < chunks; c++) s += part[c];
        y[0] = s * scale;
    } else if (inner == 1 && outer > 1 && outer * n >= AD__SPLIT_LIGHT) {
        ad__parallel_range(T, ad__sum_rows_range, &job, outer, 2, 1);
    } else {
        ad__reduce_sum(x, y, outer, n, inner, scale);
    }
}

AD__PRIVATE void ad__sum_forward(ad_tape *T, ad__axis_job *j, size_t outer)
{
    ad__reduce_sum_split(T, j->x, j->d, outer, j->n, j->inner, j->param);
}

AD__PRIVATE void ad__sum_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_real scale = n->st.reduce.param;
    ad_tensor *x = n->in[0];
    /* every element's gradient is g scale: kept as that value where allowed */
    if (g->size == 1 && ad__grad_uniform(S, x, g->data[0] * scale)) return;
    g = ad__kept(S->T, g, x, n->st.reduce.axis);
    if (scale != 1) g = ad_mul_scalar(S->T, g, scale);
    ad__accum_to(S, x, g, scale != 1);
}

/* ---- max and min: the first largest (smallest) value of each slice, where a NaN beats every
   number and the first NaN wins, as in PyTorch. The gradient goes to that one element. */
AD__INLINE int ad__beats(ad_real v, ad_real best, int largest)
{
    return (largest ? v > best : v < best) || (v != v && best == best);
}

AD__PRIVATE void ad__extreme_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__axis_job *j = (const ad__axis_job *)ctx;
    size_t n = j->n, inner = j->inner, o, i0, i, k, w;
    int largest = j->kind == AD__R_MAX;
    for (o = lo; o < hi; o++)
        for (i0 = 0; i0 < inner; i0 += w) {
            const ad_real *x = j->x + o * n * inner + i0;
            ad_real *y = j->d + o * inner + i0;
            w = inner - i0 < AD__PANEL ? inner - i0 : AD__PANEL;
            for (i = 0; i < w; i++) y[i] = x[i];
            for (k = 1; k < n; k++)
                for (i = 0; i < w; i++)
                    if (ad__beats(x[k * inner + i], y[i], largest)) y[i] = x[k * inner + i];
        }
}

AD__PRIVATE void ad__extreme_forward(ad_tape *T, ad__axis_job *j, size_t outer)
{
    ad__axis_split(T, ad__extreme_range, j, outer, AD__SPLIT_LIGHT, j->inner);
}

/* d (+)= g (1 where g is NULL) at the element each slice's result came from: the first equal
   to it, or the first NaN where it is NaN; d = 0 (or unchanged) elsewhere. */
AD__PRIVATE void ad__extreme_grad_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__axis_job *j = (const ad__axis_job *)ctx;
    size_t n = j->n, inner = j->inner, o, i0, i, k, w;
    unsigned char found[AD__PANEL];
    for (o = lo; o < hi; o++)
        for (i0 = 0; i0 < inner; i0 += w) {
            const ad_real *x = j->x + o * n * inner + i0, *y = j->y + o * inner + i0;
            ad_real *d = j->d + o * n * inner + i0;
            w = inner - i0 < AD__PANEL ? inner - i0 : AD__PANEL;
            memset(found, 0, w);
            for (k = 0; k < n; k++)
                for (i = 0; i < w; i++) {
                    ad_real v = x[k * inner + i];
                    int hit = !found[i] && (v == y[i] || (v != v && y[i] != y[i]));
                    ad_real add = hit ? (j->g ? j->g[o * inner + i0 + i] : 1) : 0;
                    found[i] |= (unsigned char)hit;
                    d[k * inner + i] = j->add ? d[k * inner + i] + add : add;
                }
        }
}

AD__PRIVATE void ad__extreme_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    int axis = n->st.reduce.axis;
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *mask = NULL;
    size_t outer;
    ad__axis_job job;
    if (!ad__wants(S, x)) return;
    memset(&job, 0, sizeof job);
    ad__reduce_view(x, axis, &outer, &job.n, &job.inner);
    job.x = x->data;
    job.y = n->out->data;
    if (S->create_graph) {
        /* g times a constant mask of the chosen elements */
        if (!(mask = ad__like(T, "ad_backward", x))) { S->failed = 1; return; }
        job.d = mask->data;
        ad__axis_split(T, ad__extreme_grad_range, &job, outer, AD__SPLIT_LIGHT, job.n * job.inner);
        ad__accum(S, x, ad_mul(T, ad__kept(T, g, x, axis), mask), 1);
        return;
    }
    job.g = g->data;
    if (!(job.d = ad__grad_target(S, x, &job.add))) return;
    ad__axis_split(T, ad__extreme_grad_range, &job, outer, AD__SPLIT_LIGHT, job.n * job.inner);
}

/* logsumexp: y = m + log(sum(exp(x - m))), m the slice's largest value, or 0 where that is
   infinite (or NaN), so that an infinite slice gives its infinity rather than inf - inf. */
/* The largest value m of each of w columns of x (columns inner apart), 0 where it is not
   finite, and the sum s of exp(x - m) down each column. */
AD__PRIVATE void ad__panel_shifted_sum(const ad_real *x, size_t n, size_t inner, size_t w, ad_real *m, ad_real *s)
{
    size_t i, k;
    for (i = 0; i < w; i++) m[i] = x[i];
    for (k = 1; k < n; k++)
        for (i = 0; i < w; i++) m[i] = x[k * inner + i] > m[i] ? x[k * inner + i] : m[i];
    for (i = 0; i < w; i++) {
        if (!(m[i] - m[i] == 0)) m[i] = 0;
        s[i] = 0;
    }
    for (k = 0; k < n; k++)
        for (i = 0; i < w; i++) s[i] += AD__F(exp)(x[k * inner + i] - m[i]);
}

AD__PRIVATE void ad__logsumexp_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__axis_job *j = (const ad__axis_job *)ctx;
    size_t n = j->n, inner = j->inner, o, i0, i, w;
    ad_real m[AD__PANEL], s[AD__PANEL];
    for (o = lo; o < hi; o++)
        for (i0 = 0; i0 < inner; i0 += w) {
            const ad_real *x = j->x + o * n * inner + i0;
            ad_real *y = j->d + o * inner + i0;
            w = inner - i0 < AD__PANEL ? inner - i0 : AD__PANEL;
            ad__panel_shifted_sum(x, n, inner, w, m, s);
            for (i = 0; i < w; i++) y[i] = m[i] + AD__F(log)(s[i]);
        }
}

/* d (+)= g exp(x - m) / s: the softmax along the axis, times the result's gradient. From m and
   s rather than as exp(x - y), which is wrong where y = m + log(s) rounds to m (x near 1e300). */
AD__PRIVATE void ad__logsumexp_grad_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__axis_job *j = (const ad__axis_job *)ctx;
    size_t n = j->n, inner = j->inner, o, i0, i, k, w;
    ad_real m[AD__PANEL], s[AD__PANEL], c[AD__PANEL];
    for (o = lo; o < hi; o++)
        for (i0 = 0; i0 < inner; i0 += w) {
            const ad_real *x = j->x + o * n * inner + i0, *g = j->g + o * inner + i0;
            ad_real *d = j->d + o * n * inner + i0;
            w = inner - i0 < AD__PANEL ? inner - i0 : AD__PANEL;
            ad__panel_shifted_sum(x, n, inner, w, m, s);
            for (i = 0; i < w; i++) c[i] = g[i] / s[i];
            for (k = 0; k < n; k++)
                for (i = 0; i < w; i++) {
                    ad_real v = c[i] * AD__F(exp)(x[k * inner + i] - m[i]);
                    d[k * inner + i] = j->add ? d[k * inner + i] + v : v;
                }
        }
}

AD__PRIVATE void ad__logsumexp_forward(ad_tape *T, ad__axis_job *j, size_t outer)
{
    ad__axis_split(T, ad__logsumexp_range, j, outer, AD__SPLIT_HEAVY, j->inner);
}

AD__PRIVATE void ad__logsumexp_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    int axis = n->st.reduce.axis;
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0];
    size_t outer;
    ad__axis_job job;
    if (!ad__wants(S, x)) return;
    if (S->create_graph) {
        ad__accum(S, x, ad_mul(T, ad__kept(T, g, x, axis), ad_softmax(T, x, axis)), 1);
        return;
    }
    memset(&job, 0, sizeof job);
    ad__reduce_view(x, axis, &outer, &job.n, &job.inner);
    job.x = x->data;
    job.y = n->out->data;
    job.g = g->data;
    if (!(job.d = ad__grad_target(S, x, &job.add))) return;
    ad__axis_split(T, ad__logsumexp_grad_range, &job, outer, AD__SPLIT_HEAVY, job.n * job.inner);
}

/* Variance and standard deviation: the mean first, then the squared deviations from it (two
   passes, which keep the precision that one pass of sums and sums of squares loses). The
   gradient is 2 (x - mean) / divisor times g for the variance, (x - mean) / (divisor y) times g
   for the deviation. */
/* the mean of each of w columns of x, columns inner apart */
AD__PRIVATE void ad__panel_mean(const ad_real *x, size_t n, size_t inner, size_t w, ad_real *mean)
{
    size_t i, k;
    for (i = 0; i < w; i++) mean[i] = 0;
    for (k = 0; k < n; k++)
        for (i = 0; i < w; i++) mean[i] += x[k * inner + i];
    for (i = 0; i < w; i++) mean[i] /= (ad_real)n;
}

AD__PRIVATE void ad__var_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__axis_job *j = (const ad__axis_job *)ctx;
    size_t n = j->n, inner = j->inner, o, i0, i, k, w;
    ad_real mean[AD__PANEL], ss[AD__PANEL];
    for (o = lo; o < hi; o++)
        for (i0 = 0; i0 < inner; i0 += w) {
            const ad_real *x = j->x + o * n * inner + i0;
            ad_real *y = j->d + o * inner + i0;
            w = inner - i0 < AD__PANEL ? inner - i0 : AD__PANEL;
            ad__panel_mean(x, n, inner, w, mean);
            for (i = 0; i < w; i++) ss[i] = 0;
            for (k = 0; k < n; k++)
                for (i = 0; i < w; i++) {
                    ad_real dv = x[k * inner + i] - mean[i];
                    ss[i] += dv * dv;
                }
            for (i = 0; i < w; i++) y[i] = j->kind == AD__R_STD ? AD__F(sqrt)(ss[i] / j->param) : ss[i] / j->param;
        }
}

AD__PRIVATE void ad__var_grad_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__axis_job *j = (const ad__axis_job *)ctx;
    size_t n = j->n, inner = j->inner, o, i0, i, k, w;
    ad_real mean[AD__PANEL], c[AD__PANEL], two = 2 / j->param;
    for (o = lo; o < hi; o++)
        for (i0 = 0; i0 < inner; i0 += w) {
            const ad_real *x = j->x + o * n * inner + i0, *g = j->g + o * inner + i0, *y = j->y + o * inner + i0;
            ad_real *d = j->d + o * n * inner + i0;
            w = inner - i0 < AD__PANEL ? inner - i0 : AD__PANEL;
            ad__panel_mean(x, n, inner, w, mean);
            for (i = 0; i < w; i++) c[i] = j->kind == AD__R_STD ? g[i] / (y[i] * j->param) : g[i] * two;
            for (k = 0; k < n; k++)
                for (i = 0; i < w; i++) {
                    ad_real v = c[i] * (x[k * inner + i] - mean[i]);
                    d[k * inner + i] = j->add ? d[k * inner + i] + v : v;
                }
        }
}

AD__PRIVATE void ad__var_forward(ad_tape *T, ad__axis_job *j, size_t outer)
{
    ad__axis_split(T, ad__var_range, j, outer, AD__SPLIT_LIGHT, j->inner);
}

AD__PRIVATE void ad__var_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    const ad__reduce_state *st = &n->st.reduce;
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *gk, *c;
    size_t outer;
    ad__axis_job job;
    if (!ad__wants(S, x)) return;
    if (S->create_graph) {
        gk = ad__kept(T, g, x, st->axis);
        if (st->kind == AD__R_STD) c = ad_div(T, gk, ad_mul_scalar(T, ad__kept(T, n->out, x, st->axis), st->param));
        else c = ad_mul_scalar(T, gk, 2 / st->param);
        ad__accum(S, x, ad_mul(T, ad_sub(T, x, ad_mean_axis(T, x, st->axis, 1)), c), 1);
        return;
    }
    memset(&job, 0, sizeof job);
    ad__reduce_view(x, st->axis, &outer, &job.n, &job.inner);
    job.x = x->data;
    job.y = n->out->data;
    job.g = g->data;
    job.kind = st->kind;
    job.param = st->param;
    if (!(job.d = ad__grad_target(S, x, &job.add))) return;
    ad__axis_split(T, ad__var_grad_range, &job, outer, AD__SPLIT_LIGHT, job.n * job.inner);
}

/* Product: the gradient of x[k] is g times the product of the values before k and the product
   of those after it, each a running product, so zeros need no special case. Recorded for
   create_graph it is built from ops: each slice x of length N spread to an [N, N] matrix whose
   row k is x with 1 at position k (ad_where), whose products along rows are those same
   products, and so a product again, which can be differentiated once more. */
AD__PRIVATE void ad__prod_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__axis_job *j = (const ad__axis_job *)ctx;
    size_t n = j->n, inner = j->inner, o, i0, i, k, w;
    ad_real p[AD__PANEL];
    for (o = lo; o < hi; o++)
        for (i0 = 0; i0 < inner; i0 += w) {
            const ad_real *x = j->x + o * n * inner + i0;
            ad_real *y = j->d + o * inner + i0;
            w = inner - i0 < AD__PANEL ? inner - i0 : AD__PANEL;
            for (i = 0; i < w; i++) p[i] = x[i];
            for (k = 1; k < n; k++)
                for (i = 0; i < w; i++) p[i] *= x[k * inner + i];
            for (i = 0; i < w; i++) y[i] = p[i];
        }
}

/* d = (the product before k) (g times the product after k), assigned */
AD__PRIVATE void ad__prod_grad_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__axis_job *j = (const ad__axis_job *)ctx;
    size_t n = j->n, inner = j->inner, o, i0, i, k, w;
    ad_real run[AD__PANEL];
    for (o = lo; o < hi; o++)
        for (i0 = 0; i0 < inner; i0 += w) {
            const ad_real *x = j->x + o * n * inner + i0, *g = j->g + o * inner + i0;
            ad_real *d = j->d + o * n * inner + i0;
            w = inner - i0 < AD__PANEL ? inner - i0 : AD__PANEL;
            for (i = 0; i < w; i++) run[i] = 1;
            for (k = 0; k < n; k++)
                for (i = 0; i < w; i++) {
                    d[k * inner + i] = run[i];
                    run[i] *= x[k * inner + i];
                }
            for (i = 0; i < w; i++) run[i] = g[i];
            for (k = n; k-- > 0;)
                for (i = 0; i < w; i++) {
                    d[k * inner + i] *= run[i];
                    run[i] *= x[k * inner + i];
                }
        }
}

AD__PRIVATE void ad__prod_forward(ad_tape *T, ad__axis_job *j, size_t outer)
{
    ad__axis_split(T, ad__prod_range, j, outer, AD__SPLIT_LIGHT, j->inner);
}

AD__PRIVATE void ad__prod_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    const ad__reduce_state *st = &n->st.reduce;
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *d;
    size_t outer, len, inner;
    ad__axis_job job;
    if (!ad__wants(S, x)) return;
    ad__reduce_view(x, st->axis, &outer, &len, &inner);
    if (S->create_graph) {
        /* x as [outer, N, inner]; the matrix [outer, N, N, inner], row k of each slice x with 1 at k */
        int s3[3], e4[4], k, m, N = x->shape[st->axis];
        ad_tensor *eye, *rows, *x3;
        s3[0] = (int)outer;
        s3[1] = N;
        s3[2] = (int)inner;
        e4[0] = e4[3] = 1;
        e4[1] = e4[2] = N;
        if (outer > INT_MAX || inner > INT_MAX) {
            ad__fail(T, "ad_prod_axis: the recorded derivative of a product over %zu slices of %zu values is too large",
                     outer * inner, len);
            S->failed = 1;
            return;
        }
        eye = ad__tensor(T, "ad_prod_axis", 4, e4, 1);
        if (!eye) { S->failed = 1; return; }
        for (k = 0; k < N; k++)
            for (m = 0; m < N; m++) eye->data[(size_t)k * (size_t)N + (size_t)m] = k == m;
        x3 = ad_reshape(T, x, 3, s3);
        rows = ad_where(T, eye, ad__scalar(T, "ad_prod_axis", 1), ad_unsqueeze(T, x3, 1));
        s3[1] = 1;
        d = ad_mul(T, ad_reshape(T, g, 3, s3), ad_prod_axis(T, rows, 2, 0));
        ad__accum(S, x, d ? ad_reshape(T, d, x->ndim, x->shape) : NULL, 1);
        return;
    }
    d = ad__like(T, "ad_backward", x);
    if (d) {
        memset(&job, 0, sizeof job);
        job.x = x->data;
        job.g = g->data;
        job.d = d->data;
        job.n = len;
        job.inner = inner;
        ad__axis_split(T, ad__prod_grad_range, &job, outer, AD__SPLIT_LIGHT, len * inner);
    }
    ad__accum(S, x, d, 1);
}

/* ---- the table, one driver for every row, and the public ops ---------------------------------- */
typedef struct ad__reduce_row {
    void (*forward)(ad_tape *T, ad__axis_job *j, size_t outer);
    ad__backward_fn backward;
} ad__reduce_row;

#define AD__REDUCE_ROW(ID, FORWARD, BACKWARD) { FORWARD, BACKWARD },
static const ad__reduce_row ad__reduce_rows[AD__R_COUNT] = { AD__REDUCE_OPS(AD__REDUCE_ROW) };
#undef AD__REDUCE_ROW

/* Reduces a (checked) along axis (resolved; -1: all of it) by row kind; correction is VAR's
   and STD's. */
AD__PRIVATE ad_tensor *ad__reduce(ad_tape *T, ad_tensor *a, int kind, int axis, int keepdim, int correction,
                                  const char *op)
{
    int shape[AD_MAX_DIMS] = {0}, ndim = ad__reduced_shape(a, axis, keepdim, shape);
    size_t outer;
    ad__axis_job job;
    ad_tensor *y;
    ad__node *node;
    memset(&job, 0, sizeof job);
    ad__reduce_view(a, axis, &outer, &job.n, &job.inner);
    job.kind = kind;
    job.param = 1;
    if (kind == AD__R_MEAN) {
        job.param = (ad_real)(1.0 / (double)job.n);
    } else if (kind == AD__R_VAR || kind == AD__R_STD) {
        long long dof = (long long)job.n - correction;
        job.param = dof > 0 ? (ad_real)dof : 0;
    }
    y = ad__tensor(T, op, ndim, shape, 1);
    if (!y) return NULL;
    job.x = a->data;
    job.d = y->data;
    ad__reduce_rows[kind].forward(T, &job, outer);
    node = ad__record1(T, op, y, ad__reduce_rows[kind].backward, a);
    if (!node) return NULL;
    node->st.reduce.kind = kind;
    node->st.reduce.axis = axis;
    node->st.reduce.param = job.param;
    return y;
}

AD__PRIVATE ad_tensor *ad__reduce_all(ad_tape *T, ad_tensor *a, int kind, const char *op)
{
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, op, "the input", a)) return NULL;
    return ad__reduce(T, a, kind, -1, 0, 0, op);
}

AD__PRIVATE ad_tensor *ad__reduce_axis(ad_tape *T, ad_tensor *a, int kind, int axis, int keepdim, int correction,
                                       const char *op)
{
    if (!T || !a) return NULL;
    axis = ad__axis_of(T, op, a, axis);
    if (axis < 0) return NULL;
    return ad__reduce(T, a, kind, axis, keepdim, correction, op);
}

AUTODIFF_API ad_tensor *ad_sum(ad_tape *T, ad_tensor *a) { return ad__reduce_all(T, a, AD__R_SUM, "ad_sum"); }
AUTODIFF_API ad_tensor *ad_mean(ad_tape *T, ad_tensor *a) { return ad__reduce_all(T, a, AD__R_MEAN, "ad_mean"); }
AUTODIFF_API ad_tensor *ad_max(ad_tape *T, ad_tensor *a) { return ad__reduce_all(T, a, AD__R_MAX, "ad_max"); }
AUTODIFF_API ad_tensor *ad_min(ad_tape *T, ad_tensor *a) { return ad__reduce_all(T, a, AD__R_MIN, "ad_min"); }
AUTODIFF_API ad_tensor *ad_sum_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim)
{
    return ad__reduce_axis(T, a, AD__R_SUM, axis, keepdim, 0, "ad_sum_axis");
}
AUTODIFF_API ad_tensor *ad_mean_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim)
{
    return ad__reduce_axis(T, a, AD__R_MEAN, axis, keepdim, 0, "ad_mean_axis");
}
AUTODIFF_API ad_tensor *ad_max_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim)
{
    return ad__reduce_axis(T, a, AD__R_MAX, axis, keepdim, 0, "ad_max_axis");
}
AUTODIFF_API ad_tensor *ad_min_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim)
{
    return ad__reduce_axis(T, a, AD__R_MIN, axis, keepdim, 0, "ad_min_axis");
}
AUTODIFF_API ad_tensor *ad_logsumexp(ad_tape *T, ad_tensor *a, int axis, int keepdim)
{
    return ad__reduce_axis(T, a, AD__R_LOGSUMEXP, axis, keepdim, 0, "ad_logsumexp");
}
AUTODIFF_API ad_tensor *ad_var_axis(ad_tape *T, ad_tensor *a, int axis, int correction, int keepdim)
{
    return ad__reduce_axis(T, a, AD__R_VAR, axis, keepdim, correction, "ad_var_axis");
}
AUTODIFF_API ad_tensor *ad_std_axis(ad_tape *T, ad_tensor *a, int axis, int correction, int keepdim)
{
    return ad__reduce_axis(T, a, AD__R_STD, axis, keepdim, correction, "ad_std_axis");
}
AUTODIFF_API ad_tensor *ad_prod_axis(ad_tape *T, ad_tensor *a, int axis, int keepdim)
{
    return ad__reduce_axis(T, a, AD__R_PROD, axis, keepdim, 0, "ad_prod_axis");
}

/* ---- argmax: indices, not recorded ----------------------------------------------------------- */
/* For each (o, i) of x viewed as [outer, n, inner], the first k at which x[o, k, i] is the
   largest (largest set) or the smallest: a NaN beats every number and the first NaN wins, as
   in PyTorch's argmax and min. Written as an int into arg and as the flat offset
   (o n + k) inner + i into offset, where these are not NULL. */
AD__PRIVATE void ad__arg_extreme(const ad_real *x, size_t outer, size_t n, size_t inner, int largest, int *arg,
                                 size_t *offset)
{
    ad_real best[AD__PANEL];
    size_t at[AD__PANEL], o, i0, i, k, w;
    for (o = 0; o < outer; o++)
        for (i0 = 0; i0 < inner; i0 += w) {
            const ad_real *src = x + o * n * inner + i0;
            w = inner - i0 < AD__PANEL ? inner - i0 : AD__PANEL;
            for (i = 0; i < w; i++) {
                best[i] = src[i];
                at[i] = 0;
            }
            for (k = 1; k < n; k++)
                for (i = 0; i < w; i++) {
                    ad_real v = src[k * inner + i];
                    if (ad__beats(v, best[i], largest)) {
                        best[i] = v;
                        at[i] = k;
                    }
                }
            for (i = 0; i < w; i++) {
                if (arg) arg[o * inner + i0 + i] = (int)at[i];
                if (offset) offset[o * inner + i0 + i] = (o * n + at[i]) * inner + i0 + i;
            }
        }
}

AUTODIFF_API int ad_argmax_axis(const ad_tensor *a, int axis, int *out)
{
    size_t outer, n, inner;
    char s[96];
    if (!a) return -1;
    axis = ad__axis_of(a->tape, "ad_argmax_axis", a, axis);
    if (axis < 0) return -1;
    if (!out) {
        ad__fail(a->tape, "ad_argmax_axis: shape %s: out is NULL", ad_shape_str(a, s, sizeof s));
        return -1;
    }
    ad__split_axis(a, axis, &outer, &n, &inner);
    ad__arg_extreme(a->data, outer, n, inner, 1, out, NULL);
    return 0;
}

/* Running sum and its adjoint, the running sum from the end: each one's gradient is the other. */
typedef struct ad__cumsum_saved {
    int axis;
    int reverse;
} ad__cumsum_saved;

AD__PRIVATE void ad__cumsum_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__axis_job *j = (const ad__axis_job *)ctx;
    size_t n = j->n, inner = j->inner, o, i, k;
    for (o = lo; o < hi; o++) {
        const ad_real *x = j->x + o * n * inner;
        ad_real *y = j->d + o * n * inner;
        if (!j->flag) {
            memcpy(y, x, inner * sizeof(ad_real));
            for (k = 1; k < n; k++)
                for (i = 0; i < inner; i++) y[k * inner + i] = y[(k - 1) * inner + i] + x[k * inner + i];
        } else {
            memcpy(y + (n - 1) * inner, x + (n - 1) * inner, inner * sizeof(ad_real));
            for (k = n - 1; k-- > 0;)
                for (i = 0; i < inner; i++) y[k * inner + i] = y[(k + 1) * inner + i] + x[k * inner + i];
        }
    }
}

AD__PRIVATE ad_tensor *ad__cumsum(ad_tape *T, ad_tensor *a, int axis, int reverse);

AD__PRIVATE void ad__cumsum_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    const ad__cumsum_saved *st = (const ad__cumsum_saved *)n->saved;
    ad__accum(S, n->in[0], ad__cumsum(S->T, g, st->axis, !st->reverse), 1);
}

AD__PRIVATE ad_tensor *ad__cumsum(ad_tape *T, ad_tensor *a, int axis, int reverse)
{
    ad__cumsum_saved *st = NULL;
    ad__axis_job job;
    ad_tensor *y;
    ad__node *node;
    size_t outer;
    if (!a) return NULL;
    if (T->grad_enabled && a->requires_grad &&
        !(st = (ad__cumsum_saved *)ad__alloc_aligned(T, sizeof *st, 16, "ad_cumsum")))
        return NULL;
    y = ad__like(T, "ad_cumsum", a);
    if (!y) return NULL;
    memset(&job, 0, sizeof job);
    ad__split_axis(a, axis, &outer, &job.n, &job.inner);
    job.x = a->data;
    job.d = y->data;
    job.flag = reverse;
    ad__axis_split(T, ad__cumsum_range, &job, outer, AD__SPLIT_LIGHT, job.n * job.inner);
    node = ad__record1(T, "ad_cumsum", y, ad__cumsum_backward, a);
    if (!node) return NULL;
    if (st) {
        st->axis = axis;
        st->reverse = reverse;
        node->saved = st;
    }
    return y;
}

AUTODIFF_API ad_tensor *ad_cumsum(ad_tape *T, ad_tensor *a, int axis)
{
    if (!T || !a) return NULL;
    axis = ad__axis_of(T, "ad_cumsum", a, axis);
    return axis < 0 ? NULL : ad__cumsum(T, a, axis, 0);
}

/* >>ops:shape -------------------------------------------------------------------------------- */
AD__PRIVATE void ad__reshape_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *x = n->in[0];
    ad__accum(S, x, ad_reshape(S->T, g, x->ndim, x->shape), 0);
}

AUTODIFF_API ad_tensor *ad_reshape(ad_tape *T, ad_tensor *a, int ndim, const int *shape)
{
    int resolved[AD_MAX_DIMS], i, infer = -1;
    size_t known = 1;
    ad_tensor *y;
    char sa[96], sb[96];
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, "ad_reshape", "the input", a)) return NULL;
    if (ndim < 0 || ndim > AD_MAX_DIMS || (ndim > 0 && !shape)) {
        ad__fail(T, "ad_reshape: %d dimensions; between 0 and %d are supported", ndim, AD_MAX_DIMS);
        return NULL;
    }
    for (i = 0; i < ndim; i++) {
        resolved[i] = shape[i];
        if (shape[i] == -1 && infer < 0) { infer = i; continue; }
        if (shape[i] <= 0) {
            ad__fail(T, "ad_reshape: %s to %s: dimension %d is %d%s", ad_shape_str(a, sa, sizeof sa),
                     ad__dims_str(ndim, shape, sb, sizeof sb), i, shape[i],
                     shape[i] == -1 ? "; only one may be -1" : "");
            return NULL;
        }
        if (known > a->size / (size_t)shape[i]) break; /* more elements than a has: no product wraps */
        known *= (size_t)shape[i];
    }
    if (i == ndim && infer >= 0 && a->size % known == 0 && a->size / known <= INT_MAX)
        resolved[infer] = (int)(a->size / known);
    if (i < ndim || (infer >= 0 && resolved[infer] < 0) || (infer < 0 && known != a->size)) {
        ad__fail(T, "ad_reshape: %s to %s: %zu elements do not fit", ad_shape_str(a, sa, sizeof sa),
                 ad__dims_str(ndim, shape, sb, sizeof sb), a->size);
        return NULL;
    }
    y = ad__tensor(T, "ad_reshape", ndim, resolved, 0);
    if (!y) return NULL;
    y->data = a->data;
    if (!ad__record1(T, "ad_reshape", y, ad__reshape_backward, a)) return NULL;
    return y;
}

AUTODIFF_API ad_tensor *ad_flatten(ad_tape *T, ad_tensor *a)
{
    int shape[2];
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, "ad_flatten", "the input", a)) return NULL;
    if (a->ndim < 1) {
        ad__fail(T, "ad_flatten: a scalar has no batch dimension");
        return NULL;
    }
    shape[0] = a->shape[0];
    shape[1] = (int)(a->size / (size_t)a->shape[0]);
    return ad_reshape(T, a, 2, shape);
}

/* y = x with axes permuted: y axis i is x axis perm[i]. */
AD__PRIVATE void ad__permute_kernel(const ad_tensor *x, const int *perm, ad_real *AD__RESTRICT y)
{
    size_t xstride[AD_MAX_DIMS], s = 1, idx[AD_MAX_DIMS] = {0}, shape[AD_MAX_DIMS], stride[AD_MAX_DIMS];
    size_t off = 0, o, i, inner, inner_stride, outer;
    int d, nd = x->ndim;
    for (d = nd - 1; d >= 0; d--) { xstride[d] = s; s *= (size_t)x->shape[d]; }
    for (d = 0; d < nd; d++) { shape[d] = (size_t)x->shape[perm[d]]; stride[d] = xstride[perm[d]]; }
    inner = nd ? shape[nd - 1] : 1;
    inner_stride = nd ? stride[nd - 1] : 0;
    outer = x->size / inner;
    for (o = 0; o < outer; o++) {
        const ad_real *src = x->data + off;
        ad_real *dst = y + o * inner;
        if (inner_stride == 1) memcpy(dst, src, inner * sizeof(ad_real)); /* the last axis stays */
        else
            for (i = 0; i < inner; i++) dst[i] = src[i * inner_stride];
        for (d = nd - 2; d >= 0; d--) {
            idx[d]++;
            off += stride[d];
            if (idx[d] < shape[d]) break;
            off -= stride[d] * shape[d];
            idx[d] = 0;
        }
    }
}

AD__PRIVATE void ad__permute_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    int inverse[AD_MAX_DIMS], d;
    for (d = 0; d < n->in[0]->ndim; d++) inverse[n->st.permute.perm[d]] = d;
    ad__accum(S, n->in[0], ad_permute(S->T, g, inverse), 1);
}

AUTODIFF_API ad_tensor *ad_permute(ad_tape *T, ad_tensor *a, const int *perm)
{
    int shape[AD_MAX_DIMS], seen[AD_MAX_DIMS] = {0}, d;
    ad_tensor *y;
    ad__node *n;
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, "ad_permute", "the input", a)) return NULL;
    if (a->ndim > 0 && !perm) { ad__fail(T, "ad_permute: perm is NULL"); return NULL; }
    for (d = 0; d < a->ndim; d++) {
        if (perm[d] < 0 || perm[d] >= a->ndim || seen[perm[d]]) {
            char s[96];
            ad__fail(T, "ad_permute: shape %s: perm[%d] = %d is not a permutation of 0..%d",
                     ad_shape_str(a, s, sizeof s), d, perm[d], a->ndim - 1);
            return NULL;
        }
        seen[perm[d]] = 1;
        shape[d] = a->shape[perm[d]];
    }
    y = ad__tensor(T, "ad_permute", a->ndim, shape, 1);
    if (!y) return NULL;
    ad__permute_kernel(a, perm, y->data);
    n = ad__record1(T, "ad_permute", y, ad__permute_backward, a);
    if (!n) return NULL;
    for (d = 0; d < a->ndim; d++) n->st.permute.perm[d] = perm[d];
    return y;
}

AUTODIFF_API ad_tensor *ad_transpose(ad_tape *T, ad_tensor *a, int axis0, int axis1)
{
    int perm[AD_MAX_DIMS], d, t;
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, "ad_transpose", "the input", a)) return NULL;
    axis0 = ad__axis(T, "ad_transpose", a, axis0);
    if (axis0 < 0) return NULL;
    axis1 = ad__axis(T, "ad_transpose", a, axis1);
    if (axis1 < 0) return NULL;
    for (d = 0; d < a->ndim; d++) perm[d] = d;
    t = perm[axis0];
    perm[axis0] = perm[axis1];
    perm[axis1] = t;
    return ad_permute(T, a, perm);
}

/* Copies small (viewed as [outer, n, inner]) into big's axis range [start, start+n) of extent
   total, or the reverse when gather is set. */
AD__PRIVATE void ad__axis_copy(ad_real *big, ad_real *small, size_t outer, size_t n, size_t inner,
                               size_t start, size_t total, int gather)
{
    size_t o, block = n * inner;
    for (o = 0; o < outer; o++) {
        ad_real *b = big + (o * total + start) * inner, *s = small + o * block;
        if (gather) memcpy(s, b, block * sizeof(ad_real));
        else memcpy(b, s, block * sizeof(ad_real));
    }
}

AD__PRIVATE ad_tensor *ad__pad_axis(ad_tape *T, ad_tensor *g, int axis, int start, int total);

/* A sweep that does not record adds g straight into its place in x's gradient (zeros around
   it when the buffer is new); one that records pads g with zeros by an op. */
AD__PRIVATE void ad__slice_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *x = n->in[0];
    int ax = n->st.slice.axis, start = n->st.slice.start, add;
    size_t outer, len, inner, o, total = (size_t)x->shape[ax];
    ad_real *d;
    if (S->create_graph) {
        ad__accum(S, x, ad__pad_axis(S->T, g, ax, start, (int)total), 1);
        return;
    }
    if (!ad__wants(S, x)) return;
    d = ad__grad_target(S, x, &add);
    if (!d) {
        S->failed = 1;
        return;
    }
    if (!add) memset(d, 0, x->size * sizeof(ad_real));
    ad__split_axis(g, ax, &outer, &len, &inner);
    for (o = 0; o < outer; o++)
        ad__add_into(d + (o * total + (size_t)start) * inner, g->data + o * len * inner, len * inner);
}

AUTODIFF_API ad_tensor *ad_slice(ad_tape *T, ad_tensor *a, int axis, int start, int end)
{
    int shape[AD_MAX_DIMS], len, ax;
    size_t outer, n, inner;
    ad_tensor *y;
    ad__node *node;
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, "ad_slice", "the input", a)) return NULL;
    ax = ad__axis(T, "ad_slice", a, axis);
    if (ax < 0) return NULL;
    len = a->shape[ax];
    if (start < 0) start += len;
    if (end < 0) end += len;
    if (start < 0 || end > len || start >= end) {
        char s[96];
        ad__fail(T, "ad_slice: shape %s, axis %d: range [%d, %d) is empty or outside 0..%d",
                 ad_shape_str(a, s, sizeof s), axis, start, end, len);
        return NULL;
    }
    memcpy(shape, a->shape, sizeof shape);
    shape[ax] = end - start;
    y = ad__tensor(T, "ad_slice", a->ndim, shape, 1);
    if (!y) return NULL;
    ad__split_axis(y, ax, &outer, &n, &inner);
    ad__axis_copy(a->data, y->data, outer, n, inner, (size_t)start, (size_t)len, 1);
    node = ad__record1(T, "ad_slice", y, ad__slice_backward, a);
    if (!node) return NULL;
    node->st.slice.axis = ax;
    node->st.slice.start = start;
    return y;
}

/* g placed at [start, start + g's extent) along axis inside zeros of extent total: the gradient
   of a slice. Its own gradient is the slice back. */
AD__PRIVATE void ad__pad_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *x = n->in[0];
    int ax = n->st.slice.axis, start = n->st.slice.start;
    ad__accum(S, x, ad_slice(S->T, g, ax, start, start + x->shape[ax]), 1);
}

AD__PRIVATE ad_tensor *ad__pad_axis(ad_tape *T, ad_tensor *g, int axis, int start, int total)
{
    int shape[AD_MAX_DIMS];
    size_t outer, n, inner;
    ad_tensor *y;
    ad__node *node;
    if (!g) return NULL;
    memcpy(shape, g->shape, sizeof shape);
    shape[axis] = total;
    y = ad__tensor(T, "ad_slice", g->ndim, shape, 1);
    if (!y) return NULL;
    memset(y->data, 0, y->size * sizeof(ad_real));
    ad__split_axis(g, axis, &outer, &n, &inner);
    ad__axis_copy(y->data, g->data, outer, n, inner, (size_t)start, (size_t)total, 0);
    node = ad__record1(T, "ad_slice", y, ad__pad_backward, g);
    if (!node) return NULL;
    node->st.slice.axis = axis;
    node->st.slice.start = start;
    return y;
}

AD__PRIVATE void ad__concat_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    int i, ax = n->st.slice.axis, start = 0;
    for (i = 0; i < n->nin; i++) {
        ad_tensor *x = n->in[i];
        if (ad__wants(S, x)) ad__accum(S, x, ad_slice(S->T, g, ax, start, start + x->shape[ax]), 1);
        start += x->shape[ax];
    }
}

AUTODIFF_API ad_tensor *ad_concat(ad_tape *T, ad_tensor *const *xs, int n, int axis)
{
    int shape[AD_MAX_DIMS], i, d, ax;
    size_t total = 0, start = 0, outer, len, inner;
    ad_tensor *y;
    ad__node *node;
    if (!T) return NULL;
    if (!xs || n < 1) { ad__fail(T, "ad_concat: no tensors given"); return NULL; }
    for (i = 0; i < n; i++)
        if (!xs[i]) return NULL;
    ax = ad__axis(T, "ad_concat", xs[0], axis);
    if (ax < 0) return NULL;
    for (i = 0; i < n; i++) {
        const ad_tensor *x = xs[i];
        int ok = x->ndim == xs[0]->ndim;
        char what[32];
        snprintf(what, sizeof what, "tensor %d", i);
        if (!ad__on_tape(T, "ad_concat", what, x)) return NULL;
        for (d = 0; ok && d < x->ndim; d++)
            if (d != ax && x->shape[d] != xs[0]->shape[d]) ok = 0;
        if (!ok) {
            char s0[96], si[96];
            ad__fail(T, "ad_concat: along axis %d, tensor %d has shape %s, which does not match %s",
                     axis, i, ad_shape_str(x, si, sizeof si), ad_shape_str(xs[0], s0, sizeof s0));
            return NULL;
        }
        total += (size_t)x->shape[ax];
    }
    if (total > INT_MAX) { ad__fail(T, "ad_concat: result too large"); return NULL; }
    memcpy(shape, xs[0]->shape, sizeof shape);
    shape[ax] = (int)total;
    y = ad__tensor(T, "ad_concat", xs[0]->ndim, shape, 1);
    if (!y) return NULL;
    for (i = 0; i < n; i++) {
        ad__split_axis(xs[i], ax, &outer, &len, &inner);
        ad__axis_copy(y->data, xs[i]->data, outer, len, inner, start, total, 0);
        start += len;
    }
    node = ad__record(T, "ad_concat", y, ad__concat_backward, xs, n);
    if (!node) return NULL;
    node->st.slice.axis = ax;
    return y;
}

/* Can shape small broadcast to shape big (NumPy rules)? */
AD__PRIVATE int ad__broadcastable(int small_ndim, const int *small, int big_ndim, const int *big)
{
    int i;
    if (small_ndim > big_ndim) return 0;
    for (i = 1; i <= small_ndim; i++)
        if (small[small_ndim - i] != 1 && small[small_ndim - i] != big[big_ndim - i]) return 0;
    return 1;
}

/* broadcast_to (reduce 0) and its adjoint sum_to (reduce 1): each one's gradient is the other. */
AD__PRIVATE ad_tensor *ad__broadcast_op(ad_tape *T, ad_tensor *a, int ndim, const int *shape, int reduce);

/* y[0..n-1] = v, on the tape's threads from AD__SPLIT_LIGHT values (the gradient of a sum) */
typedef struct ad__fill_job {
    ad_real *y;
    ad_real v;
} ad__fill_job;

AD__PRIVATE void ad__fill_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__fill_job *j = (const ad__fill_job *)ctx;
    ad_real *AD__RESTRICT y = j->y, v = j->v;
    size_t i;
    for (i = lo; i < hi; i++) y[i] = v;
}

AD__PRIVATE void ad__fill_split(ad_tape *T, ad_real *y, ad_real v, size_t n)
{
    ad__fill_job job;
    job.y = y;
    job.v = v;
    ad__parallel_range(T, ad__fill_range, &job, n, AD__SPLIT_LIGHT, AD__STORE_BLOCK);
}

AD__PRIVATE void ad__broadcast_op_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *x = n->in[0];
    ad__accum(S, x, ad__broadcast_op(S->T, g, x->ndim, x->shape, !n->st.broadcast.reduce), 1);
}

AD__PRIVATE ad_tensor *ad__broadcast_op(ad_tape *T, ad_tensor *a, int ndim, const int *shape, int reduce)
{
    const char *op = reduce ? "ad_sum_to" : "ad_broadcast_to";
    ad_tensor *y;
    ad__node *node;
    ad__walk w;
    size_t size;
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, op, "the input", a)) return NULL;
    if (!ad__check_shape(T, op, ndim, shape, &size)) return NULL;
    if (reduce ? !ad__broadcastable(ndim, shape, a->ndim, a->shape) : !ad__broadcastable(a->ndim, a->shape, ndim, shape)) {
        char sa[96], sb[96];
        ad__fail(T, "%s: shape %s cannot be %s to %s", op, ad_shape_str(a, sa, sizeof sa),
                 reduce ? "summed" : "broadcast", ad__dims_str(ndim, shape, sb, sizeof sb));
        return NULL;
    }
    y = ad__tensor(T, op, ndim, shape, 1);
    if (!y) return NULL;
    if (reduce) {
        /* walk over a's (larger) shape, reading y with the strides of the smaller one */
        memset(y->data, 0, y->size * sizeof(ad_real));
        ad__walk_init(&w, a->ndim, a->shape, y, NULL);
        ad__sum_to_kernel(&w, a->data, y->data);
    } else if (a->size == 1) {
        ad__fill_split(T, y->data, a->data[0], y->size);
    } else {
        ad__walk_init(&w, ndim, shape, a, NULL);
        ad__broadcast_kernel(&w, a->data, y->data);
    }
    node = ad__record1(T, op, y, ad__broadcast_op_backward, a);
    if (!node) return NULL;
    node->st.broadcast.reduce = reduce;
    return y;
}

AUTODIFF_API ad_tensor *ad_broadcast_to(ad_tape *T, ad_tensor *a, int ndim, const int *shape)
{
    return ad__broadcast_op(T, a, ndim, shape, 0);
}

AUTODIFF_API ad_tensor *ad_sum_to(ad_tape *T, ad_tensor *a, int ndim, const int *shape)
{
    return ad__broadcast_op(T, a, ndim, shape, 1);
}

/* ---- squeeze, unsqueeze, stack, pad ------------------------------------------------------ */
/* a with another shape of its size: a view, recorded as a reshape; errors name op */
AD__PRIVATE ad_tensor *ad__view(ad_tape *T, const char *op, ad_tensor *a, int ndim, const int *shape)
{
    ad_tensor *y = ad__tensor(T, op, ndim, shape, 0);
    if (!y) return NULL;
    y->data = a->data;
    if (!ad__record1(T, op, y, ad__reshape_backward, a)) return NULL;
    return y;
}

AUTODIFF_API ad_tensor *ad_squeeze(ad_tape *T, ad_tensor *a, int axis)
{
    int shape[AD_MAX_DIMS], i, ax, ndim = 0;
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, "ad_squeeze", "the input", a)) return NULL;
    if (a->ndim == 0 && (axis == 0 || axis == -1)) return a; /* PyTorch's rule for a scalar */
    ax = ad__axis(T, "ad_squeeze", a, axis);
    if (ax < 0) return NULL;
    if (a->shape[ax] != 1) return a;
    for (i = 0; i < a->ndim; i++)
        if (i != ax) shape[ndim++] = a->shape[i];
    return ad__view(T, "ad_squeeze", a, ndim, shape);
}

/* The position of a new axis among ndim + 1 (negative: from the end); -1 with the tape's error
   naming op when it is out of range or there is no room for another axis. */
AD__PRIVATE int ad__new_axis(ad_tape *T, const char *op, const ad_tensor *a, int axis)
{
    int ax = axis < 0 ? axis + a->ndim + 1 : axis;
    char s[96];
    if (ax < 0 || ax > a->ndim) {
        ad__fail(T, "%s: axis %d is out of range for a new axis beside shape %s (-%d..%d)", op, axis,
                 ad_shape_str(a, s, sizeof s), a->ndim + 1, a->ndim);
        return -1;
    }
    if (a->ndim == AD_MAX_DIMS) {
        ad__fail(T, "%s: shape %s has %d dimensions, the most supported (AD_MAX_DIMS): no room for a new one", op,
                 ad_shape_str(a, s, sizeof s), AD_MAX_DIMS);
        return -1;
    }
    return ax;
}

AUTODIFF_API ad_tensor *ad_unsqueeze(ad_tape *T, ad_tensor *a, int axis)
{
    int shape[AD_MAX_DIMS], i, ax;
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, "ad_unsqueeze", "the input", a)) return NULL;
    ax = ad__new_axis(T, "ad_unsqueeze", a, axis);
    if (ax < 0) return NULL;
    for (i = 0; i <= a->ndim; i++) shape[i] = i < ax ? a->shape[i] : (i == ax ? 1 : a->shape[i - 1]);
    return ad__view(T, "ad_unsqueeze", a, a->ndim + 1, shape);
}

/* Stack: input i is slice i of the new axis; its gradient is that slice of g. */
typedef struct ad__stack_saved {
    int axis;
} ad__stack_saved;

AD__PRIVATE void ad__stack_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    const ad__stack_saved *st = (const ad__stack_saved *)n->saved;
    int i;
    for (i = 0; i < n->nin; i++) {
        ad_tensor *x = n->in[i];
        if (ad__wants(S, x))
            ad__accum(S, x, ad_reshape(S->T, ad_slice(S->T, g, st->axis, i, i + 1), x->ndim, x->shape), 1);
    }
}

AUTODIFF_API ad_tensor *ad_stack(ad_tape *T, ad_tensor *const *xs, int n, int axis)
{
    int shape[AD_MAX_DIMS], i, d, ax, rec = 0;
    size_t outer = 1, inner, o;
    ad__stack_saved *st = NULL;
    ad_tensor *y;
    ad__node *node;
    char s0[96], si[96], what[32];
    if (!T) return NULL;
    if (!xs || n < 1) {
        ad__fail(T, "ad_stack: no tensors given (%s, n = %d)", xs ? "xs" : "xs NULL", n);
        return NULL;
    }
    for (i = 0; i < n; i++)
        if (!xs[i]) return NULL;
    for (i = 0; i < n; i++) {
        snprintf(what, sizeof what, "tensor %d", i);
        if (!ad__on_tape(T, "ad_stack", what, xs[i])) return NULL;
        if (!ad__same_shape(xs[i], xs[0])) {
            ad__fail(T, "ad_stack: tensor %d has shape %s, which differs from tensor 0's %s", i,
                     ad_shape_str(xs[i], si, sizeof si), ad_shape_str(xs[0], s0, sizeof s0));
            return NULL;
        }
        rec |= xs[i]->requires_grad;
    }
    ax = ad__new_axis(T, "ad_stack", xs[0], axis);
    if (ax < 0) return NULL;
    for (d = 0; d <= xs[0]->ndim; d++) shape[d] = d < ax ? xs[0]->shape[d] : (d == ax ? n : xs[0]->shape[d - 1]);
    for (d = 0; d < ax; d++) outer *= (size_t)shape[d];
    if (T->grad_enabled && rec && !(st = (ad__stack_saved *)ad__alloc_aligned(T, sizeof *st, 16, "ad_stack")))
        return NULL;
    y = ad__tensor(T, "ad_stack", xs[0]->ndim + 1, shape, 1);
    if (!y) return NULL;
    inner = xs[0]->size / outer;
    for (o = 0; o < outer; o++)
        for (i = 0; i < n; i++)
            memcpy(y->data + (o * (size_t)n + (size_t)i) * inner, xs[i]->data + o * inner, inner * sizeof(ad_real));
    node = ad__record(T, "ad_stack", y, ad__stack_backward, xs, n);
    if (!node) return NULL;
    if (st) {
        st->axis = ax;
        node->saved = st;
    }
    return y;
}

/* Pad: y[p] = x[p - before] where that is inside x, else value, over every dimension; the
   pads of the dimensions before the padded ones are 0. Its adjoint is the same op with the pads
   negated and 0 as the value, so each one's gradient is the other. */
typedef struct ad__const_pad_saved {
    int npads;
    int pads[2 * AD_MAX_DIMS];
} ad__const_pad_saved;

typedef struct ad__const_pad_job {
    const ad_real *x;
    ad_real *y;
    ad_real value;
    int ndim;
    int xs[AD_MAX_DIMS], ys[AD_MAX_DIMS], before[AD_MAX_DIMS];
} ad__const_pad_job;

/* rows [lo, hi) of y (its last dimension) */
AD__PRIVATE void ad__const_pad_rows(const void *ctx, size_t lo, size_t hi)
{
    const ad__const_pad_job *j = (const ad__const_pad_job *)ctx;
    int nd = j->ndim, d;
    long long b = j->before[nd - 1], xw = j->xs[nd - 1], yw = j->ys[nd - 1], first, end, k;
    size_t r;
    first = b > 0 ? b : 0;                 /* the part of each row that x covers: [first, end) */
    end = b + xw < yw ? b + xw : yw;
    for (r = lo; r < hi; r++) {
        ad_real *dst = j->y + r * (size_t)yw;
        size_t rem = r, src = 0, stride = (size_t)xw;
        long long a = first, e = end;
        for (d = nd - 2; d >= 0; d--) {
            long long q = (long long)(rem % (size_t)j->ys[d]) - j->before[d];
            rem /= (size_t)j->ys[d];
            if (q < 0 || q >= j->xs[d]) { a = e = 0; break; }
            src += (size_t)q * stride;
            stride *= (size_t)j->xs[d];
        }
        if (e < a) e = a;
        for (k = 0; k < a; k++) dst[k] = j->value;
        if (e > a) memcpy(dst + a, j->x + src + (size_t)(a - b), (size_t)(e - a) * sizeof(ad_real));
        for (k = e; k < yw; k++) dst[k] = j->value;
    }
}

AD__PRIVATE void ad__const_pad_backward(ad__sweep *S, ad__node *n, ad_tensor *g);

/* The padding of a checked (st's pads valid for a); errors name ad_pad. */
AD__PRIVATE ad_tensor *ad__const_pad(ad_tape *T, ad_tensor *a, const ad__const_pad_saved *st, ad_real value)
{
    ad__const_pad_job job;
    ad__const_pad_saved *saved = NULL;
    ad_tensor *y;
    ad__node *node;
    size_t w;
    int d, k;
    if (!a) return NULL;
    job.ndim = a->ndim;
    for (d = 0; d < a->ndim; d++) {
        job.xs[d] = job.ys[d] = a->shape[d];
        job.before[d] = 0;
    }
    for (k = 0; k < st->npads / 2; k++) {
        d = a->ndim - 1 - k;
        job.before[d] = st->pads[2 * k];
        job.ys[d] = a->shape[d] + st->pads[2 * k] + st->pads[2 * k + 1];
    }
    if (T->grad_enabled && a->requires_grad &&
        !(saved = (ad__const_pad_saved *)ad__alloc_aligned(T, sizeof *saved, 16, "ad_pad")))
        return NULL;
    y = ad__tensor(T, "ad_pad", a->ndim, job.ys, 1);
    if (!y) return NULL;
    job.x = a->data;
    job.y = y->data;
    job.value = value;
    if (a->ndim == 0) {
        y->data[0] = a->data[0];
    } else {
        w = (size_t)job.ys[a->ndim - 1];
        ad__parallel_range(T, ad__const_pad_rows, &job, y->size / w, (AD__SPLIT_LIGHT + w - 1) / w, ad__plane_block(w));
    }
    node = ad__record1(T, "ad_pad", y, ad__const_pad_backward, a);
    if (!node) return NULL;
    if (saved) {
        *saved = *st;
        node->saved = saved;
    }
    return y;
}

AD__PRIVATE void ad__const_pad_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    const ad__const_pad_saved *st = (const ad__const_pad_saved *)n->saved;
    ad__const_pad_saved back;
    int k;
    back.npads = st->npads;
    for (k = 0; k < st->npads; k++) back.pads[k] = -st->pads[k]; /* INT_MIN is refused by ad_pad */
    ad__accum(S, n->in[0], ad__const_pad(S->T, g, &back, 0), 1);
}

AUTODIFF_API ad_tensor *ad_pad(ad_tape *T, ad_tensor *a, int npads, const int *pads, ad_real value)
{
    ad__const_pad_saved st;
    int k;
    char s[96];
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, "ad_pad", "the input", a)) return NULL;
    ad_shape_str(a, s, sizeof s);
    if (npads < 0 || npads % 2 != 0 || npads > 2 * a->ndim) {
        ad__fail(T, "ad_pad: shape %s: %d pad values; an even number up to %d (two for each dimension) is needed", s,
                 npads, 2 * a->ndim);
        return NULL;
    }
    if (npads > 0 && !pads) {
        ad__fail(T, "ad_pad: shape %s: pads is NULL", s);
        return NULL;
    }
    st.npads = npads;
    for (k = 0; k < npads / 2; k++) {
        int d = a->ndim - 1 - k, before = pads[2 * k], after = pads[2 * k + 1];
        long long len = (long long)a->shape[d] + before + after;
        if (before == INT_MIN || after == INT_MIN) { /* their negation, the gradient's pad, would overflow */
            ad__fail(T, "ad_pad: shape %s: pad %d on dimension %d is out of range (beyond -%d)", s, INT_MIN, d,
                     INT_MAX);
            return NULL;
        }
        if (len < 1 || len > INT_MAX) {
            ad__fail(T, "ad_pad: shape %s: pads (%d, %d) make dimension %d %lld long; it must be 1..%d", s, before,
                     after, d, len, INT_MAX);
            return NULL;
        }
        st.pads[2 * k] = before;
        st.pads[2 * k + 1] = after;
    }
    return ad__const_pad(T, a, &st, value);
}

/* >>ops:index -------------------------------------------------------------------------------- */
/* Gather and scatter sharing one saved index array (on the tape), the pair behind max pooling
   and embedding. Both view their data as P planes: the source of a gather has S rows of E
   values per plane, its result L rows; row o of plane p is source row idx[p * L + o] of that
   plane. The scatter adds the rows back: each is the other's adjoint, so each one's gradient
   is the other. The entry keeps an ad__gather_state, and the entries of its gradients (of any
   order) a copy of it. */
enum ad__gather_kind { AD__GATHER_MAX_POOL, AD__GATHER_EMBEDDING };
static const char *const ad__gather_names[] = { "ad_max_pool2d", "ad_embedding" };

AD__PRIVATE ad_tensor *ad__gather(ad_tape *T, ad_tensor *v, const ad__gather_state *st, int ndim, const int *shape);
AD__PRIVATE ad_tensor *ad__scatter(ad_tape *T, ad_tensor *g, const ad__gather_state *st, int ndim, const int *shape);

/* The fewest planes of `values` values each that make whole blocks of AD__STORE_BLOCK values:
   work split over threads by planes is cut in runs of that many, so that no two threads write
   to one cache line. */
AD__INLINE size_t ad__plane_block(size_t values)
{
    size_t block = AD__STORE_BLOCK;
    while (block > 1 && values % 2 == 0) {
        values /= 2;
        block /= 2;
    }
    return block;
}

typedef struct ad__scatter_job {
    const ad_real *g;
    const int *idx;
    size_t S, L, E;
    ad_real *y;
    int add;
} ad__scatter_job;

/* Planes [lo, hi) of a scatter: each plane's rows land in that plane alone. */
AD__PRIVATE void ad__scatter_planes(const void *ctx, size_t lo, size_t hi)
{
    const ad__scatter_job *j = (const ad__scatter_job *)ctx;
    size_t p, o, S = j->S, L = j->L, E = j->E;
    if (!j->add) memset(j->y + lo * S * E, 0, (hi - lo) * S * E * sizeof(ad_real));
    for (p = lo; p < hi; p++) {
        const int *ip = j->idx + p * L;
        const ad_real *src = j->g + p * L * E;
        ad_real *dst = j->y + p * S * E;
        if (E == 1) {
            for (o = 0; o < L; o++) dst[ip[o]] += src[o];
        } else {
            for (o = 0; o < L; o++) ad__nn_add(dst + (size_t)ip[o] * E, src + o * E, E);
        }
    }
}

/* y (+)= the rows of g added at idx: y has P planes of S rows, g P planes of L rows, E values
   each. Only the rows named by idx are written when add is set. The planes (a max pooling's
   images and channels) are split over T's threads from AD__SPLIT_HEAVY values of y. */
AD__PRIVATE void ad__scatter_kernel(ad_tape *T, const ad_real *g, const int *idx, size_t P, size_t S, size_t L,
                                    size_t E, ad_real *y, int add)
{
    ad__scatter_job job;
    job.g = g;
    job.idx = idx;
    job.S = S;
    job.L = L;
    job.E = E;
    job.y = y;
    job.add = add;
    ad__parallel_items(T, ad__scatter_planes, &job, P, S * E, ad__plane_block(S * E));
}

AD__PRIVATE int ad__max_pool_2x2_adjoint(ad_tape *T, const ad_tensor *g, const int *arg, const ad_tensor *x,
                                         ad_real *d); /* >>ops:pool */

AD__PRIVATE void ad__gather_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *v = n->in[0];
    size_t E = (size_t)n->st.gather.row_len, P = v->size / ((size_t)n->st.gather.rows * E);
    ad_real *d;
    int add;
    if (!ad__wants(S, v)) return;
    if (!S->create_graph) {
        /* straight into the gradient buffer: for an embedding, only the rows used are touched */
        if ((d = ad__grad_target(S, v, &add)) == NULL) return;
        if (!add && n->st.gather.tiles && ad__max_pool_2x2_adjoint(S->T, g, n->st.gather.index, v, d))
            return;
        ad__scatter_kernel(S->T, g->data, n->st.gather.index, P, (size_t)n->st.gather.rows, g->size / (P * E), E, d,
                           add);
        return;
    }
    ad__accum(S, v, ad__scatter(S->T, g, &n->st.gather, v->ndim, v->shape), 1);
}

AD__PRIVATE void ad__scatter_backward(ad__sweep *S, ad__node *n, ad_tensor *u)
{
    ad_tensor *g = n->in[0];
    ad__accum(S, g, ad__gather(S->T, u, &n->st.gather, g->ndim, g->shape), 1);
}

/* Rows [lo, hi) of the gather's result, counted over all planes. */
typedef struct ad__gather_job {
    const ad_real *src;
    ad_real *dst;
    const int *idx;
    size_t S, L, E, rows_per_task, rows;
} ad__gather_job;

AD__PRIVATE void ad__gather_rows(const ad__gather_job *j, size_t lo, size_t hi)
{
    size_t r = lo, E = j->E;
    while (r < hi) {
        size_t p = r / j->L, end = (p + 1) * j->L < hi ? (p + 1) * j->L : hi;
        const ad_real *plane = j->src + p * j->S * E;
        if (E == 1) {
            for (; r < end; r++) j->dst[r] = plane[j->idx[r]];
        } else if (E < 64) {
            for (; r < end; r++) ad__nn_copy(j->dst + r * E, plane + (size_t)j->idx[r] * E, E);
        } else {
            /* Long rows, often from main memory: the C library's copy moves them fastest. The
               first line of each row is requested AD__GATHER_AHEAD rows early, so that the
               misses (and page walks) of many rows overlap; the hardware prefetcher streams
               the rest of a row once its copy has begun. */
            size_t ahead = r;
            for (; ahead < end && ahead < r + AD__GATHER_AHEAD; ahead++)
                AD__PREFETCH_READ(plane + (size_t)j->idx[ahead] * E);
            for (; r < end; r++) {
                if (ahead < end) AD__PREFETCH_READ(plane + (size_t)j->idx[ahead++] * E);
                memcpy(j->dst + r * E, plane + (size_t)j->idx[r] * E, E * sizeof(ad_real));
            }
        }
    }
}

AD__PRIVATE void ad__gather_task(void *ctx, int task, int thread)
{
    const ad__gather_job *j = (const ad__gather_job *)ctx;
    size_t lo = (size_t)task * j->rows_per_task, hi = lo + j->rows_per_task < j->rows ? lo + j->rows_per_task : j->rows;
    (void)thread;
    ad__gather_rows(j, lo, hi);
}

/* Gathers of many long rows, such as a batch of images picked from a data set held as one
   tensor, are split over the tape's threads from AD__GATHER_SPLIT values: the rows come mostly
   from main memory, and a second core fetching half of them halves the wait. */

AD__PRIVATE ad_tensor *ad__gather(ad_tape *T, ad_tensor *v, const ad__gather_state *st, int ndim, const int *shape)
{
    const char *op = ad__gather_names[st->kind];
    const int *idx = st->index;
    int S = st->rows, E = st->row_len;
    ad__gather_job job;
    ad_tensor *y;
    ad__node *node;
    int tasks;
    if (!v) return NULL;
    y = ad__tensor(T, op, ndim, shape, 1);
    if (!y) return NULL;
    job.src = v->data;
    job.dst = y->data;
    job.idx = idx;
    job.S = (size_t)S;
    job.E = (size_t)E;
    job.L = y->size / (v->size / ((size_t)S * E) * (size_t)E);
    job.rows = y->size / (size_t)E;
    tasks = y->size >= AD__GATHER_SPLIT && E >= 16 ? ad__thread_count(T) : 1;
    job.rows_per_task = (job.rows + (size_t)tasks - 1) / (size_t)tasks;
    if (tasks > 1) ad__parallel(T, ad__gather_task, &job, tasks);
    else ad__gather_rows(&job, 0, job.rows);
    node = ad__record1(T, op, y, ad__gather_backward, v);
    if (!node) return NULL;
    node->st.gather = *st;
    return y;
}

AD__PRIVATE ad_tensor *ad__scatter(ad_tape *T, ad_tensor *g, const ad__gather_state *st, int ndim, const int *shape)
{
    const char *op = ad__gather_names[st->kind];
    const int *idx = st->index;
    int S = st->rows, E = st->row_len;
    size_t P;
    ad_tensor *y;
    ad__node *node;
    if (!g) return NULL;
    y = ad__tensor(T, op, ndim, shape, 1);
    if (!y) return NULL;
    P = y->size / ((size_t)S * E);
    ad__scatter_kernel(T, g->data, idx, P, (size_t)S, g->size / (P * E), (size_t)E, y->data, 0);
    node = ad__record1(T, op, y, ad__scatter_backward, g);
    if (!node) return NULL;
    node->st.gather = *st;
    return y;
}

/* Take and put: a take reads each value of its result from one position of its source; a put,
   its adjoint, adds each value of its input into the source's shape at those positions. Each
   one's gradient is the other, so derivatives of any order exist. One struct on the tape
   describes both and is shared by their entries (node->saved). Source and result are cut into
   `planes` planes of equal size, and plane p of the result reads plane p of the source alone,
   so a put can split its planes over threads with no two writing one value. The positions are
   either one index along an axis for each result row, the same in every plane (index mode: the
   source's planes are [S, inner], the result's [L, inner]), or one flat offset into the source
   for each result value (offset mode). ad_index_select, ad_gather and ad_nll_loss are takes. */
typedef struct ad__take ad__take;
struct ad__take {
    const char *op;      /* the public op, named by the messages of its derivatives */
    size_t planes, src_size, out_size;
    size_t S, L, inner;  /* index mode */
    int *index;          /* index mode: L positions along the axis; NULL in offset mode */
    size_t *offset;      /* offset mode: out_size offsets into the source */
};

/* A take for planes planes of src_size and out_size values in all, with room for nindex indices
   (index mode; the caller sets S, L, inner and the indices) or, when nindex is 0, an offset for
   every result value (offset mode; the caller fills them in). NULL when memory runs out. */
AD__PRIVATE ad__take *ad__take_new(ad_tape *T, const char *op, size_t planes, size_t src_size, size_t out_size,
                                   size_t nindex)
{
    ad__take *t = (ad__take *)ad__alloc_aligned(T, sizeof(ad__take), 16, op);
    size_t count = nindex ? nindex : out_size, each = nindex ? sizeof(int) : sizeof(size_t);
    void *p;
    if (!t) return NULL;
    if (count > (size_t)-1 / each) {
        ad__fail(T, "%s: out of memory for %zu positions", op, count);
        return NULL;
    }
    p = ad__alloc(T, count * each, op);
    if (!p) return NULL;
    memset(t, 0, sizeof *t);
    t->op = op;
    t->planes = planes;
    t->src_size = src_size;
    t->out_size = out_size;
    if (nindex) t->index = (int *)p;
    else t->offset = (size_t *)p;
    return t;
}

AD__PRIVATE size_t *ad__take_offsets(ad__take *t) { return t->offset; }

typedef struct ad__take_job {
    const ad__take *t;
    const ad_real *src;
    ad_real *dst;
    int add;
} ad__take_job;

/* result units [lo, hi) of a take: rows of inner values (index mode) or values */
AD__PRIVATE void ad__take_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__take_job *j = (const ad__take_job *)ctx;
    const ad__take *t = j->t;
    size_t u;
    if (!t->index) {
        for (u = lo; u < hi; u++) j->dst[u] = j->src[t->offset[u]];
        return;
    }
    for (u = lo; u < hi; u++) {
        const ad_real *from = j->src + ((u / t->L) * t->S + (size_t)t->index[u % t->L]) * t->inner;
        if (t->inner == 1) j->dst[u] = from[0];
        else memcpy(j->dst + u * t->inner, from, t->inner * sizeof(ad_real));
    }
}

/* planes [lo, hi) of a put, cleared first unless it adds */
AD__PRIVATE void ad__put_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__take_job *j = (const ad__take_job *)ctx;
    const ad__take *t = j->t;
    size_t sp = t->src_size / t->planes, rp = t->out_size / t->planes, p, u;
    if (!j->add) memset(j->dst + lo * sp, 0, (hi - lo) * sp * sizeof(ad_real));
    for (p = lo; p < hi; p++) {
        if (!t->index) {
            for (u = p * rp; u < (p + 1) * rp; u++) j->dst[t->offset[u]] += j->src[u];
            continue;
        }
        for (u = 0; u < t->L; u++) {
            ad_real *to = j->dst + (p * t->S + (size_t)t->index[u]) * t->inner;
            const ad_real *from = j->src + (p * t->L + u) * t->inner;
            if (t->inner == 1) to[0] += from[0];
            else ad__add_into(to, from, t->inner);
        }
    }
}

/* dst = the take of src, split over the tape's threads by result rows or values */
AD__PRIVATE void ad__take_run(ad_tape *T, const ad__take *t, const ad_real *src, ad_real *dst)
{
    ad__take_job job;
    job.t = t;
    job.src = src;
    job.dst = dst;
    job.add = 0;
    if (t->index)
        ad__parallel_range(T, ad__take_range, &job, t->planes * t->L, (AD__SPLIT_LIGHT + t->inner - 1) / t->inner,
                           ad__plane_block(t->inner));
    else ad__parallel_range(T, ad__take_range, &job, t->out_size, AD__SPLIT_LIGHT, AD__STORE_BLOCK);
}

/* dst (+)= the put of src, split over the tape's threads by planes; each plane's values are
   added in one order whatever the split */
AD__PRIVATE void ad__put_run(ad_tape *T, const ad__take *t, const ad_real *src, ad_real *dst, int add)
{
    ad__take_job job;
    size_t sp = t->src_size / t->planes;
    job.t = t;
    job.src = src;
    job.dst = dst;
    job.add = add;
    ad__parallel_range(T, ad__put_range, &job, t->planes, (AD__SPLIT_LIGHT + sp - 1) / sp, ad__plane_block(sp));
}

AD__PRIVATE ad_tensor *ad__put_op(ad_tape *T, const ad__take *t, ad_tensor *g, int ndim, const int *shape);

AD__PRIVATE void ad__take_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    const ad__take *t = (const ad__take *)n->saved;
    ad_tensor *x = n->in[0];
    ad_real *d;
    int add;
    if (!ad__wants(S, x)) return;
    if (S->create_graph) {
        ad__accum(S, x, ad__put_op(S->T, t, g, x->ndim, x->shape), 1);
        return;
    }
    /* straight into x's gradient: when it is already there, only the positions taken change */
    if ((d = ad__grad_target(S, x, &add)) != NULL) ad__put_run(S->T, t, g->data, d, add);
}

/* The take t of x, shaped (ndim, shape); recorded with t as its saved state. */
AD__PRIVATE ad_tensor *ad__take_op(ad_tape *T, const ad__take *t, ad_tensor *x, int ndim, const int *shape)
{
    ad_tensor *y;
    ad__node *node;
    if (!x) return NULL;
    y = ad__tensor(T, t->op, ndim, shape, 1);
    if (!y) return NULL;
    AUTODIFF_ASSERT(y->size == t->out_size && x->size == t->src_size);
    ad__take_run(T, t, x->data, y->data);
    node = ad__record1(T, t->op, y, ad__take_backward, x);
    if (!node) return NULL;
    node->saved = t;
    return y;
}

AD__PRIVATE void ad__put_backward(ad__sweep *S, ad__node *n, ad_tensor *u)
{
    ad_tensor *g = n->in[0];
    if (ad__wants(S, g)) ad__accum(S, g, ad__take_op(S->T, (const ad__take *)n->saved, u, g->ndim, g->shape), 1);
}

/* The put t of g into a new tensor shaped (ndim, shape), the take's source shape. */
AD__PRIVATE ad_tensor *ad__put_op(ad_tape *T, const ad__take *t, ad_tensor *g, int ndim, const int *shape)
{
    ad_tensor *y;
    ad__node *node;
    if (!g) return NULL;
    y = ad__tensor(T, t->op, ndim, shape, 1);
    if (!y) return NULL;
    AUTODIFF_ASSERT(y->size == t->src_size && g->size == t->out_size);
    ad__put_run(T, t, g->data, y->data, 0);
    node = ad__record1(T, t->op, y, ad__put_backward, g);
    if (!node) return NULL;
    node->saved = t;
    return y;
}

AUTODIFF_API ad_tensor *ad_index_select(ad_tape *T, ad_tensor *a, int axis, const int *index, int n)
{
    int shape[AD_MAX_DIMS], ax, i;
    size_t outer, len, inner, size;
    ad__take *t;
    char s[96];
    if (!T || !a) return NULL;
    ax = ad__axis_of(T, "ad_index_select", a, axis);
    if (ax < 0) return NULL;
    ad_shape_str(a, s, sizeof s);
    if (n < 1 || !index) {
        if (n < 1) ad__fail(T, "ad_index_select: shape %s: n is %d; it must be at least 1", s, n);
        else ad__fail(T, "ad_index_select: shape %s: index is NULL", s);
        return NULL;
    }
    for (i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= a->shape[ax]) {
            ad__fail(T, "ad_index_select: shape %s, axis %d: index %d (position %d) is outside 0..%d", s, axis,
                     index[i], i, a->shape[ax] - 1);
            return NULL;
        }
    memcpy(shape, a->shape, sizeof shape);
    shape[ax] = n;
    if (!ad__check_shape(T, "ad_index_select", a->ndim, shape, &size)) return NULL;
    ad__split_axis(a, ax, &outer, &len, &inner);
    t = ad__take_new(T, "ad_index_select", outer, a->size, size, (size_t)n);
    if (!t) return NULL;
    t->S = len;
    t->L = (size_t)n;
    t->inner = inner;
    memcpy(t->index, index, (size_t)n * sizeof(int));
    return ad__take_op(T, t, a, a->ndim, shape);
}

AUTODIFF_API ad_tensor *ad_gather(ad_tape *T, ad_tensor *a, int axis, const int *index, int ndim, const int *shape)
{
    size_t size, stride[AD_MAX_DIMS], pos[AD_MAX_DIMS] = {0}, planes = 1, base = 0, k, *off;
    int ax, d;
    ad__take *t;
    char s[96], si[96];
    if (!T || !a) return NULL;
    ax = ad__axis_of(T, "ad_gather", a, axis);
    if (ax < 0) return NULL;
    ad_shape_str(a, s, sizeof s);
    if (ndim != a->ndim || !shape) {
        if (!shape) ad__fail(T, "ad_gather: a %s: the index's shape is NULL", s);
        else ad__fail(T, "ad_gather: a %s: the index has %d dimensions; it must have a's %d", s, ndim, a->ndim);
        return NULL;
    }
    if (!ad__check_shape(T, "ad_gather", ndim, shape, &size)) return NULL;
    ad__dims_str(ndim, shape, si, sizeof si);
    for (d = 0; d < ndim; d++)
        if (d != ax && shape[d] > a->shape[d]) {
            ad__fail(T, "ad_gather: a %s, index %s, axis %d: dimension %d of the index is larger than a's", s, si,
                     axis, d);
            return NULL;
        }
    if (!index) {
        ad__fail(T, "ad_gather: a %s, index %s: index is NULL", s, si);
        return NULL;
    }
    /* the leading dimensions that index and a share make the planes */
    for (d = 0; d < ax && shape[d] == a->shape[d]; d++) planes *= (size_t)shape[d];
    t = ad__take_new(T, "ad_gather", planes, a->size, size, 0);
    if (!t) return NULL;
    off = t->offset;
    for (d = ndim - 1, k = 1; d >= 0; d--) {
        stride[d] = k;
        k *= (size_t)a->shape[d];
    }
    /* base: the offset of the current position with the axis's index left out */
    for (k = 0; k < size; k++) {
        if (index[k] < 0 || index[k] >= a->shape[ax]) {
            ad__fail(T, "ad_gather: a %s, index %s, axis %d: index[%zu] = %d is outside 0..%d", s, si, axis, k,
                     index[k], a->shape[ax] - 1);
            return NULL;
        }
        off[k] = base + (size_t)index[k] * stride[ax];
        for (d = ndim - 1; d >= 0; d--) {
            if (d != ax) base += stride[d];
            if (++pos[d] < (size_t)shape[d]) break;
            if (d != ax) base -= stride[d] * pos[d];
            pos[d] = 0;
        }
    }
    return ad__take_op(T, t, a, ndim, shape);
}

/* where: y = c ? a : b with all three broadcast. The gradient of a is where(c, g, 0), of b
   where(c, 0, g), each summed to its input's shape: ops again, so derivatives of any order
   exist; for operands of the output's size in sweeps that do not record, one fused pass each.
   cond is kept in the op's state, not among its inputs, as it gets no gradient. */
typedef struct ad__where_saved {
    ad_tensor *cond;
    const char *op; /* ad_where or ad_masked_fill */
} ad__where_saved;

typedef struct ad__where_job {
    const ad_real *c, *a, *b, *g;
    ad_real *y;
    int ndim, which, add;
    size_t shape[AD_MAX_DIMS], sc[AD_MAX_DIMS], sa[AD_MAX_DIMS], sb[AD_MAX_DIMS];
} ad__where_job;

/* rows [lo, hi) of y (its last dimension), each operand read with its broadcast strides */
AD__PRIVATE void ad__where_rows(const void *ctx, size_t lo, size_t hi)
{
    const ad__where_job *j = (const ad__where_job *)ctx;
    int nd = j->ndim, d;
    size_t w = j->shape[nd - 1], ic = j->sc[nd - 1], ia = j->sa[nd - 1], ib = j->sb[nd - 1], r, i;
    for (r = lo; r < hi; r++) {
        size_t rem = r, oc = 0, oa = 0, ob = 0;
        const ad_real *c, *a, *b;
        ad_real *y = j->y + r * w;
        for (d = nd - 2; d >= 0; d--) {
            size_t q = rem % j->shape[d];
            rem /= j->shape[d];
            oc += q * j->sc[d];
            oa += q * j->sa[d];
            ob += q * j->sb[d];
        }
        c = j->c + oc;
        a = j->a + oa;
        b = j->b + ob;
        for (i = 0; i < w; i++) y[i] = c[i * ic] != 0 ? a[i * ia] : b[i * ib];
    }
}

/* d (+)= g where c is non-zero (which 0) or zero (which 1), all of one size: values [lo, hi) */
AD__PRIVATE void ad__where_grad_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__where_job *j = (const ad__where_job *)ctx;
    const ad_real *AD__RESTRICT c = j->c, *AD__RESTRICT g = j->g;
    ad_real *AD__RESTRICT d = j->y;
    size_t i;
    if (j->add)
        for (i = lo; i < hi; i++) d[i] += ((c[i] != 0) != j->which) ? g[i] : 0;
    else
        for (i = lo; i < hi; i++) d[i] = ((c[i] != 0) != j->which) ? g[i] : 0;
}

AD__PRIVATE ad_tensor *ad__where(ad_tape *T, const char *op, ad_tensor *cond, ad_tensor *a, ad_tensor *b);

AD__PRIVATE void ad__where_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    const ad__where_saved *st = (const ad__where_saved *)n->saved;
    ad_tape *T = S->T;
    ad_tensor *cond = st->cond, *x, *zero;
    ad__where_job job;
    for (job.which = 0; job.which < 2; job.which++) {
        x = n->in[job.which];
        if (!ad__wants(S, x)) continue;
        if (!S->create_graph && x->size == g->size && cond->size == g->size) {
            job.c = cond->data;
            job.g = g->data;
            if (!(job.y = ad__grad_target(S, x, &job.add))) return;
            ad__parallel_range(T, ad__where_grad_range, &job, g->size, AD__SPLIT_LIGHT, AD__STORE_BLOCK);
            continue;
        }
        zero = ad__scalar(T, st->op, 0);
        ad__accum_to(S, x, job.which ? ad__where(T, st->op, cond, zero, g) : ad__where(T, st->op, cond, g, zero), 1);
    }
}

/* cond ? a : b, checked; errors name op. */
AD__PRIVATE ad_tensor *ad__where(ad_tape *T, const char *op, ad_tensor *cond, ad_tensor *a, ad_tensor *b)
{
    static const char *const role[3] = {"cond", "a", "b"};
    ad_tensor *in[3], *y;
    ad__where_saved *st = NULL;
    ad__where_job job;
    ad__node *node;
    int shape[AD_MAX_DIMS], nd = 0, i, k;
    size_t w;
    if (!cond || !a || !b) return NULL;
    in[0] = cond;
    in[1] = a;
    in[2] = b;
    for (k = 0; k < 3; k++) {
        if (!ad__on_tape(T, op, role[k], in[k])) return NULL;
        if (in[k]->ndim > nd) nd = in[k]->ndim;
    }
    for (i = 0; i < nd; i++) {
        shape[i] = 1;
        for (k = 0; k < 3; k++) {
            int dk = i < nd - in[k]->ndim ? 1 : in[k]->shape[i - (nd - in[k]->ndim)];
            if (dk != 1 && shape[i] != 1 && dk != shape[i]) {
                char s0[96], s1[96], s2[96];
                ad__fail(T, "%s: shapes %s (cond), %s and %s cannot be broadcast together (dimension %d)", op,
                         ad_shape_str(cond, s0, sizeof s0), ad_shape_str(a, s1, sizeof s1),
                         ad_shape_str(b, s2, sizeof s2), i);
                return NULL;
            }
            if (dk != 1) shape[i] = dk;
        }
    }
    if (T->grad_enabled && (a->requires_grad || b->requires_grad) &&
        !(st = (ad__where_saved *)ad__alloc_aligned(T, sizeof *st, 16, op)))
        return NULL;
    y = ad__tensor(T, op, nd, shape, 1);
    if (!y) return NULL;
    memset(&job, 0, sizeof job);
    job.ndim = nd ? nd : 1;
    job.shape[0] = 1;
    for (i = 0; i < nd; i++) job.shape[i] = (size_t)shape[i];
    if (nd) {
        ad__bcast_strides(cond->shape, cond->ndim, nd, job.sc);
        ad__bcast_strides(a->shape, a->ndim, nd, job.sa);
        ad__bcast_strides(b->shape, b->ndim, nd, job.sb);
    }
    job.c = cond->data;
    job.a = a->data;
    job.b = b->data;
    job.y = y->data;
    w = job.shape[job.ndim - 1];
    ad__parallel_range(T, ad__where_rows, &job, y->size / w, (AD__SPLIT_LIGHT + w - 1) / w, ad__plane_block(w));
    node = ad__record2(T, op, y, ad__where_backward, a, b);
    if (!node) return NULL;
    if (st) {
        st->cond = cond;
        st->op = op;
        node->saved = st;
    }
    return y;
}

AUTODIFF_API ad_tensor *ad_where(ad_tape *T, ad_tensor *cond, ad_tensor *a, ad_tensor *b)
{
    if (!T) return NULL;
    return ad__where(T, "ad_where", cond, a, b);
}

AUTODIFF_API ad_tensor *ad_masked_fill(ad_tape *T, ad_tensor *a, ad_tensor *mask, ad_real value)
{
    char sa[96], sm[96];
    if (!T || !a || !mask) return NULL;
    if (!ad__on_tape(T, "ad_masked_fill", "the input", a) || !ad__on_tape(T, "ad_masked_fill", "mask", mask))
        return NULL;
    if (!ad__broadcastable(mask->ndim, mask->shape, a->ndim, a->shape)) {
        ad__fail(T, "ad_masked_fill: mask %s cannot be broadcast to the input's shape %s",
                 ad_shape_str(mask, sm, sizeof sm), ad_shape_str(a, sa, sizeof sa));
        return NULL;
    }
    return ad__where(T, "ad_masked_fill", mask, ad__scalar(T, "ad_masked_fill", value), a);
}

/* >>ops:linalg ------------------------------------------------------------------------------- */
AD__PRIVATE void ad__matmul_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *a = n->in[0], *b = n->in[1];
    int ta = n->st.matmul.trans_a, tb = n->st.matmul.trans_b;
    /* C = op(A) op(B): dA = g op(B)^T (transposed back when A was), dB = op(A)^T g likewise */
    if (ad__wants(S, a))
        ad__accum_to(S, a, ta ? ad_matmul_t(T, b, g, tb, 1) : ad_matmul_t(T, g, b, 0, !tb), 1);
    if (ad__wants(S, b))
        ad__accum_to(S, b, tb ? ad_matmul_t(T, g, a, 1, ta) : ad_matmul_t(T, a, g, !ta, 0), 1);
}

/* op(a) op(b); errors name op, the function the caller called. */
AD__PRIVATE ad_tensor *ad__matmul(ad_tape *T, const char *op, ad_tensor *a, ad_tensor *b, int trans_a, int trans_b)
{
    int shape[AD_MAX_DIMS], nd, m, k, k2, n, i, batch = 1;
    ad_tensor *y, *big;
    ad__node *node;
    size_t sa, sb;
    char s1[96], s2[96];
    if (!T || !a || !b) return NULL;
    if (!ad__check_pair(T, op, a, b)) return NULL;
    trans_a = trans_a != 0;
    trans_b = trans_b != 0;
    if (a->ndim < 2 || b->ndim < 2) {
        ad__fail(T, "%s: %s x %s: both operands need at least 2 dimensions", op,
                 ad_shape_str(a, s1, sizeof s1), ad_shape_str(b, s2, sizeof s2));
        return NULL;
    }
    m = a->shape[a->ndim - 2 + trans_a];
    k = a->shape[a->ndim - 1 - trans_a];
    k2 = b->shape[b->ndim - 2 + trans_b];
    n = b->shape[b->ndim - 1 - trans_b];
    if (k != k2) {
        ad__fail(T, "%s: %s%s x %s%s: inner dimensions %d and %d differ", op, ad_shape_str(a, s1, sizeof s1),
                 trans_a ? "^T" : "", ad_shape_str(b, s2, sizeof s2), trans_b ? "^T" : "", k, k2);
        return NULL;
    }
    if (a->ndim > 2 && b->ndim > 2 &&
        (a->ndim != b->ndim || memcmp(a->shape, b->shape, (size_t)(a->ndim - 2) * sizeof(int)) != 0)) {
        ad__fail(T, "%s: %s x %s: batch dimensions differ", op, ad_shape_str(a, s1, sizeof s1),
                 ad_shape_str(b, s2, sizeof s2));
        return NULL;
    }
    if (a->ndim > 2 && b->ndim == 2 && !trans_a) {
        /* a batch of rows times one matrix is one tall product */
        int flat[2], out[AD_MAX_DIMS];
        flat[0] = (int)(a->size / (size_t)k);
        flat[1] = k;
        memcpy(out, a->shape, sizeof out);
        out[a->ndim - 1] = n;
        return ad_reshape(T, ad__matmul(T, op, ad_reshape(T, a, 2, flat), b, 0, trans_b), a->ndim, out);
    }
    big = a->ndim >= b->ndim ? a : b;
    nd = big->ndim;
    for (i = 0; i < nd - 2; i++) {
        shape[i] = big->shape[i];
        batch *= big->shape[i];
    }
    shape[nd - 2] = m;
    shape[nd - 1] = n;
    y = ad__tensor(T, op, nd, shape, 1);
    if (!y) return NULL;
    sa = a->ndim > 2 ? (size_t)m * k : 0;
    sb = b->ndim > 2 ? (size_t)k * n : 0;
    for (i = 0; i < batch; i++) {
        if (ad__gemm(T, trans_a, trans_b, m, n, k, a->data + i * sa, a->shape[a->ndim - 1],
                     b->data + i * sb, b->shape[b->ndim - 1], y->data + (size_t)i * m * n, n, 0) != 0) {
            ad__fail(T, "%s: out of memory for the packing buffer", op);
            return NULL;
        }
    }
    node = ad__record2(T, op, y, ad__matmul_backward, a, b);
    if (!node) return NULL;
    node->st.matmul.trans_a = trans_a;
    node->st.matmul.trans_b = trans_b;
    return y;
}

AUTODIFF_API ad_tensor *ad_matmul_t(ad_tape *T, ad_tensor *a, ad_tensor *b, int trans_a, int trans_b)
{
    return ad__matmul(T, "ad_matmul_t", a, b, trans_a, trans_b);
}

AUTODIFF_API ad_tensor *ad_matmul(ad_tape *T, ad_tensor *a, ad_tensor *b) { return ad__matmul(T, "ad_matmul", a, b, 0, 0); }

/* dx = g W^T, dW = x^T g, db = column sums of g, each computed straight into (or added onto)
   the input's gradient buffer; for sweeps that do not record. */
AD__PRIVATE void ad__linear_backward_fused(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *x = n->in[0], *W = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    int rows = x->shape[0], in = W->shape[0], out = W->shape[1], add, r;
    ad_real *d;
    if (ad__wants(S, x) && (d = ad__grad_target(S, x, &add)) != NULL &&
        ad__gemm(S->T, 0, 1, rows, in, out, g->data, out, W->data, out, d, in, add) != 0)
        S->failed = 1;
    if (ad__wants(S, W) && (d = ad__grad_target(S, W, &add)) != NULL &&
        ad__gemm(S->T, 1, 0, in, out, rows, x->data, in, g->data, out, d, out, add) != 0)
        S->failed = 1;
    if (b && ad__wants(S, b) && (d = ad__grad_target(S, b, &add)) != NULL) {
        if (!add) memset(d, 0, (size_t)out * sizeof(ad_real));
        for (r = 0; r < rows; r++) ad__add_into(d, g->data + (size_t)r * out, (size_t)out);
    }
    if (S->failed && !S->T->has_error) ad__fail(S->T, "ad_linear: out of memory in the backward sweep");
}

AD__PRIVATE void ad__linear_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *W = n->in[1], *b = n->nin > 2 ? n->in[2] : NULL;
    if (!S->create_graph) {
        ad__linear_backward_fused(S, n, g);
        return;
    }
    if (ad__wants(S, x)) ad__accum(S, x, ad_matmul_t(T, g, W, 0, 1), 1);
    if (ad__wants(S, W)) ad__accum(S, W, ad_matmul_t(T, x, g, 1, 0), 1);
    if (b && ad__wants(S, b)) ad__accum_to(S, b, g, 0);
}

AUTODIFF_API ad_tensor *ad_linear(ad_tape *T, ad_tensor *x, ad_tensor *W, ad_tensor *b)
{
    int shape[2], in, out, rows, r;
    ad_tensor *y, *ins[3];
    char s1[96], s2[96];
    if (!T || !x || !W) return NULL;
    if (!ad__check_pair(T, "ad_linear", x, W) || (b && !ad__check_pair(T, "ad_linear", x, b))) return NULL;
    if (W->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != W->shape[0]) {
        ad__fail(T, "ad_linear: x %s and W %s: W must be [in, out] with in = x's last dimension",
                 ad_shape_str(x, s1, sizeof s1), ad_shape_str(W, s2, sizeof s2));
        return NULL;
    }
    in = W->shape[0];
    out = W->shape[1];
    if (b && !(b->ndim == 1 && b->shape[0] == out)) {
        ad__fail(T, "ad_linear: W %s and b %s: b must be [%d]", ad_shape_str(W, s1, sizeof s1),
                 ad_shape_str(b, s2, sizeof s2), out);
        return NULL;
    }
    if (x->ndim != 2) {
        /* any leading dimensions are rows */
        int flat[2], full[AD_MAX_DIMS];
        flat[0] = (int)(x->size / (size_t)in);
        flat[1] = in;
        memcpy(full, x->shape, sizeof full);
        full[x->ndim - 1] = out;
        return ad_reshape(T, ad_linear(T, ad_reshape(T, x, 2, flat), W, b), x->ndim, full);
    }
    rows = x->shape[0];
    shape[0] = rows;
    shape[1] = out;
    y = ad__tensor(T, "ad_linear", 2, shape, 1);
    if (!y) return NULL;
    if (b)
        for (r = 0; r < rows; r++) memcpy(y->data + (size_t)r * out, b->data, (size_t)out * sizeof(ad_real));
    if (ad__gemm(T, 0, 0, rows, out, in, x->data, in, W->data, out, y->data, out, b != NULL) != 0) {
        ad__fail(T, "ad_linear: out of memory for the packing buffer");
        return NULL;
    }
    ins[0] = x;
    ins[1] = W;
    ins[2] = b;
    if (!ad__record(T, "ad_linear", y, ad__linear_backward, ins, b ? 3 : 2)) return NULL;
    return y;
}

/* >>ops:nn ----------------------------------------------------------------------------------- */
/* The largest of v[0..n-1] and their sum, each over eight interleaved partial results combined
   in a fixed order: eight independent chains, which the compiler puts in one vector, where one
   chain would wait for each add in turn. */
AD__PRIVATE ad_real ad__max8(const ad_real *v, size_t n)
{
    ad_real part[8], m;
    size_t j, k;
    for (k = 0; k < 8; k++) part[k] = v[0];
    for (j = 0; j + 8 <= n; j += 8)
        for (k = 0; k < 8; k++) part[k] = v[j + k] > part[k] ? v[j + k] : part[k];
    for (; j < n; j++) part[0] = v[j] > part[0] ? v[j] : part[0];
    for (m = part[0], k = 1; k < 8; k++) m = part[k] > m ? part[k] : m;
    return m;
}

/* The eight partial results of ad__sum8 and ad__dot8, combined in a fixed order. */
AD__INLINE ad_real ad__combine8(const ad_real *part)
{
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

AD__PRIVATE ad_real ad__sum8(const ad_real *v, size_t n)
{
    ad_real part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j, k;
    for (j = 0; j + 8 <= n; j += 8)
        for (k = 0; k < 8; k++) part[k] += v[j + k];
    for (; j < n; j++) part[0] += v[j];
    return ad__combine8(part);
}

/* sum(a b) over n values, in the same eight chains. */
AD__PRIVATE ad_real ad__dot8(const ad_real *a, const ad_real *b, size_t n)
{
    ad_real part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j, k;
    for (j = 0; j + 8 <= n; j += 8)
        for (k = 0; k < 8; k++) part[k] += a[j + k] * b[j + k];
    for (; j < n; j++) part[0] += a[j] * b[j];
    return ad__combine8(part);
}

/* Softmax (or log-softmax) of the contiguous rows of x, [rows, n], with the vector exp, taken
   over all the rows in one call (short rows, such as a classifier's ten, would each fill a part
   of one vector); returns 0 (nothing done) where there is none. */
AD__PRIVATE int ad__softmax_rows_vectorised(const ad_real *x, ad_real *y, size_t rows, size_t n, int log_form)
{
    size_t r, j;
    if (!ad__unary_vectorised(AD__U_EXP, x, y, 0)) return 0; /* asks whether there is one */
    for (r = 0; r < rows; r++) {
        ad_real m = ad__max8(x + r * n, n);
        for (j = 0; j < n; j++) y[r * n + j] = x[r * n + j] - m;
    }
    ad__unary_vectorised(AD__U_EXP, y, y, rows * n);
    for (r = 0; r < rows; r++) {
        const ad_real *src = x + r * n;
        ad_real *dst = y + r * n, s = ad__sum8(dst, n);
        if (log_form) {
            ad_real m = ad__max8(src, n), ls = AD__F(log)(s);
            for (j = 0; j < n; j++) dst[j] = (src[j] - m) - ls;
        } else {
            ad_real inv = 1 / s;
            for (j = 0; j < n; j++) dst[j] *= inv;
        }
    }
    return 1;
}

/* Softmax (or log-softmax) along the middle axis of x viewed as [outer, n, inner]. */
AD__PRIVATE void ad__softmax_kernel(const ad_real *x, ad_real *y, size_t outer, size_t n, size_t inner,
                                    int log_form)
{
    size_t o, i, j;
    if (inner == 1 && ad__softmax_rows_vectorised(x, y, outer, n, log_form)) return;
    for (o = 0; o < outer; o++)
        for (i = 0; i < inner; i++) {
            const ad_real *src = x + o * n * inner + i;
            ad_real *dst = y + o * n * inner + i;
            ad_real m = src[0], s = 0;
            for (j = 1; j < n; j++) m = src[j * inner] > m ? src[j * inner] : m;
            if (log_form) {
                ad_real ls;
                for (j = 0; j < n; j++) {
                    dst[j * inner] = src[j * inner] - m;
                    s += AD__F(exp)(dst[j * inner]);
                }
                ls = AD__F(log)(s);
                for (j = 0; j < n; j++) dst[j * inner] -= ls;
            } else {
                ad_real inv;
                for (j = 0; j < n; j++) {
                    dst[j * inner] = AD__F(exp)(src[j * inner] - m);
                    s += dst[j * inner];
                }
                inv = 1 / s;
                for (j = 0; j < n; j++) dst[j * inner] *= inv;
            }
        }
}

/* The groups [lo, hi) of a softmax over outer groups of n x inner values. */
typedef struct ad__softmax_job {
    const ad_real *x;
    ad_real *y;
    size_t n, inner;
    int log_form;
} ad__softmax_job;

AD__PRIVATE void ad__softmax_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__softmax_job *j = (const ad__softmax_job *)ctx;
    size_t at = lo * j->n * j->inner;
    ad__softmax_kernel(j->x + at, j->y + at, hi - lo, j->n, j->inner, j->log_form);
}

/* Softmax groups split over the tape's threads, whole rows to each, from AD__SPLIT_HEAVY
   values on. */
AD__PRIVATE void ad__softmax_split(ad_tape *T, const ad_real *x, ad_real *y, size_t outer, size_t n, size_t inner,
                                   int log_form)
{
    ad__softmax_job job;
    job.x = x;
    job.y = y;
    job.n = n;
    job.inner = inner;
    job.log_form = log_form;
    ad__parallel_items(T, ad__softmax_range, &job, outer, n * inner, 1);
}

/* d (+)= y (g - sum(g y)) over the contiguous rows [lo, hi) of len values */
typedef struct ad__softmax_grad_job {
    const ad_real *y, *g;
    ad_real *d;
    size_t len;
    int add;
} ad__softmax_grad_job;

AD__PRIVATE void ad__softmax_grad_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__softmax_grad_job *job = (const ad__softmax_grad_job *)ctx;
    size_t len = job->len, r, j;
    const ad_real *AD__RESTRICT y = job->y + lo * len, *AD__RESTRICT g = job->g + lo * len;
    ad_real *AD__RESTRICT d = job->d + lo * len;
    for (r = lo; r < hi; r++, y += len, g += len, d += len) {
        ad_real dot = ad__dot8(g, y, len);
        if (job->add)
            for (j = 0; j < len; j++) d[j] += y[j] * (g[j] - dot);
        else
            for (j = 0; j < len; j++) d[j] = y[j] * (g[j] - dot);
    }
}

/* dx (+)= y (g - sum(g y)) row by row in one pass, for a softmax over contiguous rows in a sweep
   that does not record; returns 0 (nothing done) for other cases, which go through ops. */
AD__PRIVATE int ad__softmax_backward_fused(ad__sweep *S, ad__node *n, ad_tensor *gt)
{
    ad_tensor *x = n->in[0];
    ad__softmax_grad_job job;
    size_t outer, len, inner;
    if (S->create_graph || n->st.softmax.log_form) return 0;
    ad__split_axis(x, n->st.softmax.axis, &outer, &len, &inner);
    if (inner != 1) return 0;
    if (!ad__wants(S, x)) return 1;
    job.d = ad__grad_target(S, x, &job.add);
    if (!job.d) return 1;
    job.y = n->out->data;
    job.g = gt->data;
    job.len = len;
    ad__parallel_items(S->T, ad__softmax_grad_range, &job, outer, len, 1);
    return 1;
}

AD__PRIVATE void ad__softmax_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *y = n->out, *gy;
    int axis = n->st.softmax.axis;
    if (ad__softmax_backward_fused(S, n, g)) return;
    if (n->st.softmax.log_form) {
        /* log-softmax: g - softmax * sum(g) */
        ad__accum(S, n->in[0], ad_sub(T, g, ad_mul(T, ad_exp(T, y), ad_sum_axis(T, g, axis, 1))), 1);
    } else {
        /* softmax: y * g - y * sum(y * g) */
        gy = ad_mul(T, g, y);
        ad__accum(S, n->in[0], ad_sub(T, gy, ad_mul(T, y, ad_sum_axis(T, gy, axis, 1))), 1);
    }
}

AD__PRIVATE ad_tensor *ad__softmax(ad_tape *T, ad_tensor *a, int axis, int log_form)
{
    const char *op = log_form ? "ad_log_softmax" : "ad_softmax";
    size_t outer, n, inner;
    ad_tensor *y;
    ad__node *node;
    if (!T || !a) return NULL;
    if (!ad__on_tape(T, op, "the input", a)) return NULL;
    axis = ad__axis(T, op, a, axis);
    if (axis < 0) return NULL;
    y = ad__like(T, op, a);
    if (!y) return NULL;
    ad__split_axis(a, axis, &outer, &n, &inner);
    ad__softmax_split(T, a->data, y->data, outer, n, inner, log_form);
    node = ad__record1(T, op, y, ad__softmax_backward, a);
    if (!node) return NULL;
    node->st.softmax.axis = axis;
    node->st.softmax.log_form = log_form;
    return y;
}

AUTODIFF_API ad_tensor *ad_softmax(ad_tape *T, ad_tensor *a, int axis) { return ad__softmax(T, a, axis, 0); }
AUTODIFF_API ad_tensor *ad_log_softmax(ad_tape *T, ad_tensor *a, int axis) { return ad__softmax(T, a, axis, 1); }

/* >>ops:conv --------------------------------------------------------------------------------- */
/* The geometry of a 2-D sliding window, shared by convolution and pooling. An op that needs it
   later saves a copy on the tape; node->saved points at it. */
typedef struct ad__win2d {
    int n, c, h, w;             /* input [n, c, h, w] */
    int o, kh, kw;              /* convolution: weight [o, c / groups, kh, kw]; pooling: o = c */
    int oh, ow;                 /* output [n, o, oh, ow] */
    int sh, sw, ph, pw, dh, dw; /* stride, zero padding on each side, dilation */
    int groups;
    int exclude_pad;            /* average pooling: divide by the cells inside the input only */
} ad__win2d;

AD__PRIVATE const ad__win2d *ad__win_of(const ad__node *n)
{
    return (const ad__win2d *)n->saved;
}

/* Saves G with the entry n; 0 when memory runs out. Nothing is saved for an unrecorded op. */
AD__PRIVATE int ad__win_save(ad_tape *T, ad__node *n, const ad__win2d *G, const char *op)
{
    ad__win2d *copy;
    if (n == &T->sink) return 1;
    copy = (ad__win2d *)ad__alloc(T, sizeof *copy, op);
    if (!copy) return 0;
    *copy = *G;
    n->saved = copy;
    return 1;
}

/* y = v (add 0) or y += v (add 1) */
AD__PRIVATE void ad__nn_fill(ad_real *AD__RESTRICT y, ad_real v, size_t n, int add)
{
    size_t i = 0, j;
    if (add) {
        for (; i + 8 <= n; i += 8)
            for (j = 0; j < 8; j++) y[i + j] += v;
        for (; i < n; i++) y[i] += v;
    } else {
        for (; i + 8 <= n; i += 8)
            for (j = 0; j < 8; j++) y[i + j] = v;
        for (; i < n; i++) y[i] = v;
    }
}

/* Eight partial sums in a fixed order: the same result on every run. */
AD__PRIVATE ad_real ad__nn_sum(const ad_real *AD__RESTRICT x, size_t n)
{
    ad_real p[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0;
    size_t i = 0, j;
    for (; i + 8 <= n; i += 8)
        for (j = 0; j < 8; j++) p[j] += x[i + j];
    for (; i < n; i++) s += x[i];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])) + s;
}

/* The outputs o in [*lo, *hi) of count whose input position o * stride + off is in [0, size). */
AD__PRIVATE void ad__win_range(int off, int stride, int size, int count, int *lo, int *hi)
{
    long long a, b;
    if (stride == 1) { /* the common case, without the divisions */
        a = off >= 0 ? 0 : -(long long)off;
        b = (long long)size - off <= 0 ? 0 : (long long)size - off;
    } else {
        a = off >= 0 ? 0 : (-(long long)off + stride - 1) / stride;
        b = (long long)size - off <= 0 ? 0 : ((long long)size - off + stride - 1) / stride;
    }
    if (b > count) b = count;
    if (a > b) a = b;
    *lo = (int)a;
    *hi = (int)b;
}

/* Copies a run of an image row. Up to 32 values are moved by straight-line code: a call to
   memcpy for each short run would cost more than the copy. */
AD__INLINE void ad__copy_run(ad_real *AD__RESTRICT y, const ad_real *AD__RESTRICT x, int n)
{
    if (n > 32) {
        memcpy(y, x, (size_t)n * sizeof(ad_real));
        return;
    }
    if (n >= 16) { memcpy(y, x, 16 * sizeof(ad_real)); y += 16; x += 16; n -= 16; }
    if (n >= 16) { memcpy(y, x, 16 * sizeof(ad_real)); y += 16; x += 16; n -= 16; }
    if (n >= 8) { memcpy(y, x, 8 * sizeof(ad_real)); y += 8; x += 8; n -= 8; }
    if (n >= 4) { memcpy(y, x, 4 * sizeof(ad_real)); y += 4; x += 4; n -= 4; }
    if (n > 0) y[0] = x[0];
    if (n > 1) y[1] = x[1];
    if (n > 2) y[2] = x[2];
}

/* Adds a run of an image row into another, in blocks of eight written in place: a call for
   each short run would cost more than the adds. */
AD__INLINE void ad__add_run(ad_real *AD__RESTRICT y, const ad_real *AD__RESTRICT x, int n)
{
    int i = 0, j;
    for (; i + 8 <= n; i += 8)
        for (j = 0; j < 8; j++) y[i + j] += x[i + j];
    for (; i < n; i++) y[i] += x[i];
}

/* col [channels * kh * kw, oh * ow] from one image's channels (x points at the first): row
   (c, ki, kj) holds, for every output position, the input value under kernel tap (ki, kj), or 0
   in the padding. The rows of small images are short, so the work per row is kept small: no
   call for an empty fill, and rows without padding across copied by one tight loop. */
AD__PRIVATE void ad__im2col(const ad__win2d *G, int channels, const ad_real *AD__RESTRICT x,
                            ad_real *AD__RESTRICT col)
{
    const int oh = G->oh, ow = G->ow, sh = G->sh, sw = G->sw, w = G->w;
    size_t L = (size_t)oh * ow;
    int c, ki, kj, oy, ox, ylo, yhi, xlo, xhi, n;
    for (c = 0; c < channels; c++)
        for (ki = 0; ki < G->kh; ki++) {
            int yoff = ki * G->dh - G->ph;
            for (kj = 0; kj < G->kw; kj++) {
                ad_real *row = col + ((size_t)(c * G->kh + ki) * G->kw + kj) * L, *dst;
                int xoff = kj * G->dw - G->pw;
                const ad_real *src;
                ad__win_range(yoff, sh, G->h, oh, &ylo, &yhi);
                ad__win_range(xoff, sw, w, ow, &xlo, &xhi);
                if (xlo >= xhi) ylo = yhi = oh; /* the tap never meets the input */
                if (ylo > 0) memset(row, 0, (size_t)ylo * ow * sizeof(ad_real));
                if (yhi < oh) memset(row + (size_t)yhi * ow, 0, (size_t)(oh - yhi) * ow * sizeof(ad_real));
                if (ylo >= yhi) continue;
                n = xhi - xlo;
                src = x + ((size_t)c * G->h + (size_t)(ylo * sh + yoff)) * w + (xlo * sw + xoff);
                dst = row + (size_t)ylo * ow;
                if (sw == 1 && n == ow) { /* no padding across: the rows are runs alone */
                    for (oy = ylo; oy < yhi; oy++, src += (size_t)sh * w, dst += ow) ad__copy_run(dst, src, n);
                    continue;
                }
                for (oy = ylo; oy < yhi; oy++, src += (size_t)sh * w, dst += ow) {
                    for (ox = 0; ox < xlo; ox++) dst[ox] = 0;
                    if (sw == 1) ad__copy_run(dst + xlo, src, n);
                    else for (ox = 0; ox < n; ox++) dst[xlo + ox] = src[(size_t)ox * sw];
                    for (ox = xhi; ox < ow; ox++) dst[ox] = 0;
                }
            }
        }
}

/* The adjoint of ad__im2col: adds every entry of col into the input cell it was read from. */
AD__PRIVATE void ad__col2im(const ad__win2d *G, int channels, const ad_real *AD__RESTRICT col,
                            ad_real *AD__RESTRICT x)
{
    const int oh = G->oh, ow = G->ow, sh = G->sh, sw = G->sw, w = G->w;
    size_t L = (size_t)oh * ow;
    int c, ki, kj, oy, i, ylo, yhi, xlo, xhi, n;
    for (c = 0; c < channels; c++)
        for (ki = 0; ki < G->kh; ki++) {
            int yoff = ki * G->dh - G->ph;
            ad__win_range(yoff, sh, G->h, oh, &ylo, &yhi);
            for (kj = 0; kj < G->kw; kj++) {
                int xoff = kj * G->dw - G->pw;
                const ad_real *src;
                ad_real *dst;
                ad__win_range(xoff, sw, w, ow, &xlo, &xhi);
                if (xlo >= xhi || ylo >= yhi) continue;
                n = xhi - xlo;
                src = col + ((size_t)(c * G->kh + ki) * G->kw + kj) * L + (size_t)ylo * ow + xlo;
                dst = x + ((size_t)c * G->h + (size_t)(ylo * sh + yoff)) * w + (xlo * sw + xoff);
                for (oy = ylo; oy < yhi; oy++, src += ow, dst += (size_t)sh * w) {
                    if (sw == 1) ad__add_run(dst, src, n);
                    else for (i = 0; i < n; i++) dst[(size_t)i * sw] += src[i];
                }
            }
        }
}

#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
/* ad__col2im with AVX-512 for stride 1 across: each run of sixteen values of an input row is
   summed in a register from every tap and output row that reaches it, in ad__col2im's order
   (so the sums are the same), then stored once; the same run of up to eight channels at a
   time, so that their adds overlap. A tap's part of a run is expanded from its row of col into
   the lanes it reaches, which reads nothing outside that row. This does channels [c0, c0 + cb)
   (cb a constant where it is inlined: the sums then stay in registers). */
AD__HOT __attribute__((target("avx512f"))) void ad__col2im_block(const ad__win2d *G, int c0, const int cb,
                                                                const float *AD__RESTRICT col,
                                                                float *AD__RESTRICT x)
{
    const int oh = G->oh, ow = G->ow, w = G->w, kh = G->kh, kw = G->kw;
    const size_t L = (size_t)oh * ow, plane = (size_t)G->h * w, tap_stride = (size_t)kh * kw * L;
    int iy, x0, ki, kj, b;
    for (iy = 0; iy < G->h; iy++)
        for (x0 = 0; x0 < w; x0 += 16) {
            float *dst = x + ((size_t)c0 * G->h + (size_t)iy) * w + x0;
            __mmask16 run = ad__first_lanes(w - x0);
            __m512 acc[AD__COL2IM_CHANNELS];
#pragma GCC unroll 8
            for (b = 0; b < cb; b++) acc[b] = _mm512_maskz_loadu_ps(run, dst + b * plane);
            for (ki = 0; ki < kh; ki++) {
                int t = iy + G->ph - ki * G->dh, oy = t / G->sh;
                if (t < 0 || t % G->sh || oy >= oh) continue;
                for (kj = 0; kj < kw; kj++) {
                    /* lanes [lo, hi) of the run take outputs x0 + lane - shift of this tap */
                    int shift = kj * G->dw - G->pw, lo = shift - x0 > 0 ? shift - x0 : 0, hi = 16;
                    const float *src = col + ((size_t)(c0 * kh + ki) * kw + kj) * L + (size_t)oy * ow;
                    __mmask16 lanes;
                    if (hi > ow + shift - x0) hi = ow + shift - x0;
                    if (hi > w - x0) hi = w - x0;
                    if (lo >= hi) continue;
                    lanes = (__mmask16)(ad__first_lanes(hi) & ~ad__first_lanes(lo));
                    src += x0 + lo - shift;
#pragma GCC unroll 8
                    for (b = 0; b < cb; b++)
                        acc[b] = _mm512_add_ps(acc[b], _mm512_maskz_expandloadu_ps(lanes, src + b * tap_stride));
                }
            }
#pragma GCC unroll 8
            for (b = 0; b < cb; b++) _mm512_mask_storeu_ps(dst + b * plane, run, acc[b]);
        }
}

AD__PRIVATE __attribute__((target("avx512f"))) void ad__col2im_avx512(const ad__win2d *G, int channels,
                                                                     const float *AD__RESTRICT col,
                                                                     float *AD__RESTRICT x)
{
    enum { CB = AD__COL2IM_CHANNELS };
    int c0;
    for (c0 = 0; c0 + CB <= channels; c0 += CB) ad__col2im_block(G, c0, CB, col, x);
    if (c0 < channels) ad__col2im_block(G, c0, channels - c0, col, x);
}
#endif

/* ad__col2im at AVX-512's width where the processor has it (float builds), for stride 1 across,
   from AD__COL2IM_MIN_CHANNELS channels on rows of at most AD__COL2IM_MAX_WIDTH values; 0 when
   it was not done there. There a small image's runs are short and the portable loop's cost per
   run dominates: 1.3x to 2.5x faster from 4 to 32 channels of 7 to 14 values. With fewer
   channels the sums of a row wait on each other, and longer rows make long runs, which the
   portable loop adds as fast (measured: 0.4x with one channel of 28 values, 0.9x to 1.1x with
   eight). */
AD__INLINE int ad__col2im_wide(const ad__win2d *G, int channels, const ad_real *col, ad_real *x)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    if (G->sw == 1 && channels >= AD__COL2IM_MIN_CHANNELS && G->w <= AD__COL2IM_MAX_WIDTH &&
        ad__isa() == AD__ISA_AVX512) {
        ad__col2im_avx512(G, channels, col, x);
        return 1;
    }
#endif
    (void)G;
    (void)channels;
    (void)col;
    (void)x;
    return 0;
}

/* Convolutions straight from the images (stride and dilation 1, one group, with AVX2 or
   AVX-512): the forward map and the weight gradient without im2col's or im2row's matrix, which
   for a small image cost more than the products (a MNIST CNN's step ran 1.2x faster).
   Both take an output plane sixteen positions at a time (AVX2's forward map eight), in its
   own order (across rows; the last vector's tail is empty). With stride 1, the inputs that tap
   (ki, kj) meets under those positions lie in the same order in the plane shifted by kj - pw
   across and by ki - ph down, stored with rows of ow values. So the input is stored once for each channel and kj (rows
   -ph .. oh + kh - 2 - ph of it, ow values a row, 0 in the padding), and a tap's vector is
   sixteen values from row ki on: one load, where im2col would copy the plane kh times more.
   The weight gradient stores the output gradients of AD__WGRAD_OUTPUTS channels vector by
   vector, the channels side by side ([vector][channel][16]), so that its inner loop reads them
   at fixed offsets. With AVX-512 the input gradient is the forward map's adjoint on the same
   planes (ad__conv_input_grad_avx512): each tap's sums are added where the forward map reads,
   and the planes into the image where ad__straight_inputs copied them from. */
AD__INLINE int ad__straight_vectors(const ad__win2d *G)
{
    return (G->oh * G->ow + 15) / 16;
}

/* Input rows one channel's input holds for each kj: every row an output row reads. */
AD__INLINE int ad__straight_rows(const ad__win2d *G)
{
    return G->oh + G->kh - 1;
}

/* The rows [*inside, *past) of a plane, those that read input rows 0, 1, ...; the others are
   padding. */
AD__INLINE void ad__straight_rows_inside(const ad__win2d *G, int *inside, int *past)
{
    const int rows = ad__straight_rows(G);
    *inside = G->ph < rows ? G->ph : rows;
    *past = G->h + G->ph < rows ? G->h + G->ph : rows;
}

/* Floats of one channel's input for one kj: its rows, room for a vector read from the last
   row's tail, whole lines. */
AD__INLINE size_t ad__straight_plane(const ad__win2d *G)
{
    return ((size_t)ad__straight_rows(G) * G->ow + 15 + 15) / 16 * 16;
}

/* Floats of an image's inputs, and of its gradient vectors for one block of channels. */
AD__INLINE size_t ad__straight_input_floats(const ad__win2d *G)
{
    return (size_t)G->c * G->kw * ad__straight_plane(G);
}

AD__INLINE size_t ad__wgrad_grad_floats(const ad__win2d *G)
{
    return (size_t)ad__straight_vectors(G) * AD__WGRAD_OUTPUTS * 16;
}

/* Images of a chunk, summed in registers before one reduction (at least one): those whose
   gradient vectors and inputs of one channel fit AD__WGRAD_CHUNK_BYTES. */
AD__INLINE int ad__wgrad_chunk(const ad__win2d *G)
{
    size_t per_image = (ad__wgrad_grad_floats(G) + ad__straight_input_floats(G) / G->c) * sizeof(ad_real);
    size_t chunk = per_image >= AD__WGRAD_CHUNK_BYTES ? 1 : AD__WGRAD_CHUNK_BYTES / per_image;
    return chunk < (size_t)G->n ? (int)chunk : G->n;
}

/* The weight gradient's blocks of AD__WGRAD_OUTPUTS output channels by a run of taps in one
   kernel row: AD__WGRAD_TAPS taps, then the row's last taps in runs of two and one. */
AD__INLINE size_t ad__wgrad_blocks(const ad__win2d *G)
{
    int runs = G->kw / AD__WGRAD_TAPS + G->kw % AD__WGRAD_TAPS / 2 + G->kw % AD__WGRAD_TAPS % 2;
    return (size_t)((G->o + AD__WGRAD_OUTPUTS - 1) / AD__WGRAD_OUTPUTS) * G->c * G->kh * runs;
}

/* Floats of every block's sums kept as vectors between the chunks of a part (AVX-512's weight
   gradient), or 0 where they would not fit AD__WGRAD_KEEP_BYTES or the processor has no
   AVX-512: each chunk's sums are then reduced on their own and added. */
AD__INLINE size_t ad__wgrad_keep_floats(const ad__win2d *G)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    size_t floats = ad__wgrad_blocks(G) * AD__WGRAD_OUTPUTS * AD__WGRAD_TAPS * 16;
    return ad__isa() == AD__ISA_AVX512 && floats * sizeof(float) <= AD__WGRAD_KEEP_BYTES ? floats : 0;
#else
    (void)G;
    return 0;
#endif
}

/* Scratch of one part: a chunk's inputs, then its gradient vectors, then the kept sums. */
AD__INLINE size_t ad__straight_scratch_floats(const ad__win2d *G)
{
    return (size_t)ad__wgrad_chunk(G) * (ad__straight_input_floats(G) + ad__wgrad_grad_floats(G)) +
           ad__wgrad_keep_floats(G);
}

#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
/* The lanes [lo, hi) of count outputs (at most 16) whose first reads column col of a row of w
   values, and the others after it, that fall inside the row. */
AD__INLINE __mmask16 ad__straight_lanes(int col, int count, int w, int *lo)
{
    int first = col < 0 ? -col : 0, hi = w - col < count ? w - col : count;
    *lo = first;
    return (__mmask16)(hi > first ? ad__first_lanes(hi) & ~ad__first_lanes(first) : 0);
}

/* The inputs of images [n0, n1) of x into xs (64-byte aligned; see ad__straight_vectors),
   rounded to bfloat16 when round is set. Each plane is written whole, sixteen columns at a time:
   the rows that read the input in a loop of one load and one store a row, the others (the
   padding above and below, or every row when none of the sixteen columns falls inside the
   input) as 0. */
AD__HOT __attribute__((target("avx512f"))) void ad__straight_inputs_body(const ad__win2d *G,
                                                                       const float *AD__RESTRICT x, int n0, int n1,
                                                                       float *AD__RESTRICT xs, const int round)
{
    const int rows = ad__straight_rows(G), h = G->h, w = G->w, ow = G->ow;
    const size_t plane = ad__straight_plane(G);
    const __m512 zero = _mm512_setzero_ps();
    size_t room;
    int n, c, kj, a, r, lo, inside, past;
    ad__straight_rows_inside(G, &inside, &past);
    for (n = n0; n < n1; n++)
        for (c = 0; c < G->c; c++) {
            const float *src = x + ((size_t)n * G->c + c) * h * w;
            for (kj = 0; kj < G->kw; kj++, xs += plane) {
                for (a = 0; a < ow; a += 16) { /* sixteen columns of every row */
                    int col = a + kj - G->pw, count = ow - a < 16 ? ow - a : 16;
                    __mmask16 lanes = ad__straight_lanes(col, count, w, &lo), out = ad__first_lanes(count);
                    const int first_read = lanes ? inside : past; /* past: no row reads the input */
                    for (r = 0; r < first_read; r++) _mm512_mask_storeu_ps(xs + (size_t)r * ow + a, out, zero);
                    /* the first value inside the row into lane lo: no address before the row */
                    if (lo)
                        for (; r < past; r++)
                            _mm512_mask_storeu_ps(
                                xs + (size_t)r * ow + a, out,
                                ad__bf16_round_avx512(
                                    _mm512_maskz_expandloadu_ps(lanes, src + (size_t)(r - G->ph) * w + col + lo),
                                    round));
                    else
                        for (; r < past; r++)
                            _mm512_mask_storeu_ps(
                                xs + (size_t)r * ow + a, out,
                                ad__bf16_round_avx512(_mm512_maskz_loadu_ps(lanes, src + (size_t)(r - G->ph) * w + col),
                                                      round));
                    for (; r < rows; r++) _mm512_mask_storeu_ps(xs + (size_t)r * ow + a, out, zero);
                }
                for (room = (size_t)rows * ow; room < plane; room += 16) /* the room after the rows: 0 */
                    _mm512_mask_storeu_ps(xs + room, ad__first_lanes((long long)(plane - room)), zero);
            }
        }
}

/* ad__straight_inputs_body with round a constant in each call, so that the loops of floats
   carry no test of it. */
AD__PRIVATE __attribute__((target("avx512f"))) void ad__straight_inputs(const ad__win2d *G,
                                                                       const float *AD__RESTRICT x, int n0, int n1,
                                                                       float *AD__RESTRICT xs, int round)
{
    if (round) ad__straight_inputs_body(G, x, n0, n1, xs, 1);
    else ad__straight_inputs_body(G, x, n0, n1, xs, 0);
}

/* The gradient vectors of channels [o0, o0 + AD__WGRAD_OUTPUTS) of images [n0, n1) of g into
   gs (64-byte aligned), rounded to bfloat16 when round is set; channels past the last, and the
   last vector's tail, are 0. */
AD__PRIVATE __attribute__((target("avx512f"))) void ad__wgrad_grads(const ad__win2d *G, const float *AD__RESTRICT g,
                                                                   int n0, int n1, int o0, float *AD__RESTRICT gs,
                                                                   int round)
{
    enum { OB = AD__WGRAD_OUTPUTS };
    const int vectors = ad__straight_vectors(G);
    const size_t L = (size_t)G->oh * G->ow;
    const __mmask16 tail = ad__first_lanes((long long)(L - 16 * (size_t)(vectors - 1)));
    int n, o, v;
    for (n = n0; n < n1; n++, gs += (size_t)vectors * OB * 16)
        for (o = 0; o < OB; o++) {
            const float *src = o0 + o < G->o ? g + ((size_t)n * G->o + o0 + o) * L : NULL;
            for (v = 0; v < vectors; v++)
                _mm512_store_ps(gs + ((size_t)v * OB + o) * 16,
                                src ? ad__bf16_round_avx512(
                                          _mm512_maskz_loadu_ps(v + 1 < vectors ? 0xFFFF : tail, src + 16 * v), round)
                                    : _mm512_setzero_ps());
        }
}

/* The sums of the lanes of sixteen vectors, in one vector: lane 4j + m holds the sum of
   v[j + 4m]. Pairs of vectors are folded side by side (halves, then quarters, ...), so the
   sixteen sums cost fifteen adds. */
AD__HOT __attribute__((target("avx512f"))) __m512 ad__sum16(const __m512 *v)
{
    __m512 r[8], q[4], p[2];
    int i;
#pragma GCC unroll 8
    for (i = 0; i < 8; i++) /* blocks 0, 1: v[2i]'s halves added; blocks 2, 3: v[2i + 1]'s */
        r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
#pragma GCC unroll 4
    for (i = 0; i < 4; i++) /* block j: v[4i + j]'s four partial sums */
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0xDD));
#pragma GCC unroll 2
    for (i = 0; i < 2; i++) /* block j: two partial sums of v[8i + j], then two of v[8i + 4 + j] */
        p[i] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(q[2 * i], q[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(p[0], p[1], 0x88), _mm512_shuffle_ps(p[0], p[1], 0xDD));
}

/* The sums of the lanes of acc[o][t] into dst[o * ld + t] (added when add is set), for the first
   outputs channels and taps taps. */
AD__HOT __attribute__((target("avx512f"))) void ad__wgrad_store(__m512 acc[AD__WGRAD_OUTPUTS][AD__WGRAD_TAPS],
                                                                float *dst, size_t ld, int outputs, int taps, int add)
{
    enum { N = AD__WGRAD_OUTPUTS * AD__WGRAD_TAPS, GROUPS = (N + 15) / 16 };
    __m512 v[GROUPS * 16];
    float sum[GROUPS * 16];
    int i, o, t;
#pragma GCC unroll 32
    for (i = 0; i < GROUPS * 16; i++) v[i] = i < N ? acc[i / AD__WGRAD_TAPS][i % AD__WGRAD_TAPS] : _mm512_setzero_ps();
#pragma GCC unroll 2
    for (i = 0; i < GROUPS; i++) _mm512_storeu_ps(sum + 16 * i, ad__sum16(v + 16 * i));
    for (o = 0; o < outputs; o++)
        for (t = 0; t < taps; t++) {
            int k = o * AD__WGRAD_TAPS + t, lane = 16 * (k / 16) + 4 * (k % 4) + k % 16 / 4;
            dst[(size_t)o * ld + t] = add ? dst[(size_t)o * ld + t] + sum[lane] : sum[lane];
        }
}

/* One block of ad__conv_weight_grad_avx512: for output channels [o0, o0 + AD__WGRAD_OUTPUTS) and
   the tb taps from (c, ki, kj0) (a constant where it is inlined, so that a short last block
   computes only its own taps), the sums over the output positions of images [c0, c1), from the
   buffers xs and gs, reduced into sums: stored for the first chunk of a part, added for the
   others. With kept sums (kept, NULL without: the block's AD__WGRAD_OUTPUTS x AD__WGRAD_TAPS
   vectors are the b-th there), the sums go on from the vectors kept unless first, and are kept
   again unless last: reduced and stored once a part. */
AD__HOT __attribute__((target("avx512f"))) void ad__wgrad_block(const ad__win2d *G, const float *AD__RESTRICT xs,
                                                               const float *AD__RESTRICT gs, int c0, int c1, int o0,
                                                               int c, int ki, int kj0, const int tb,
                                                               float *AD__RESTRICT kept, size_t b, int first, int last,
                                                               float *AD__RESTRICT sums, size_t ld)
{
    enum { OB = AD__WGRAD_OUTPUTS, TB = AD__WGRAD_TAPS };
    float *keep = kept ? kept + b * OB * TB * 16 : NULL;
    const int kh = G->kh, kw = G->kw, vectors = ad__straight_vectors(G);
    const size_t image_x = ad__straight_input_floats(G), image_g = ad__wgrad_grad_floats(G);
    const size_t plane = ad__straight_plane(G), L = (size_t)G->oh * G->ow;
    const __mmask16 tail = ad__first_lanes((long long)(L - 16 * (size_t)(vectors - 1)));
    __m512 acc[OB][TB];
    int n, t, o, v;
#pragma GCC unroll 8
    for (o = 0; o < OB; o++)
#pragma GCC unroll 4
        for (t = 0; t < TB; t++) /* all TB: ad__wgrad_store reads every one */
            acc[o][t] = keep && !first ? _mm512_load_ps(keep + (o * TB + t) * 16) : _mm512_setzero_ps();
    for (n = c0; n < c1; n++) {
        const float *gp = gs + (size_t)(n - c0) * image_g;
        const float *xp = xs + (size_t)(n - c0) * image_x + ((size_t)c * kw + kj0) * plane + (size_t)ki * G->ow;
        for (v = 0; v < vectors; v++, xp += 16, gp += OB * 16) {
            __m512 xv[TB];
            if (v + 1 < vectors) { /* unmasked: a masked load takes a register more from the sums */
#pragma GCC unroll 4
                for (t = 0; t < tb; t++) xv[t] = _mm512_loadu_ps(xp + t * plane);
            } else {
#pragma GCC unroll 4
                for (t = 0; t < tb; t++) xv[t] = _mm512_maskz_loadu_ps(tail, xp + t * plane);
            }
#pragma GCC unroll 8
            for (o = 0; o < OB; o++) {
                __m512 gv = _mm512_load_ps(gp + o * 16);
                /* in a register: GCC would otherwise load it into each of its tb multiply-adds,
                   and the block's loads would outnumber the two a cycle the processor takes */
                __asm__("" : "+v"(gv));
#pragma GCC unroll 4
                for (t = 0; t < tb; t++) acc[o][t] = _mm512_fmadd_ps(gv, xv[t], acc[o][t]);
            }
        }
    }
    if (keep && !last) {
#pragma GCC unroll 8
        for (o = 0; o < OB; o++)
#pragma GCC unroll 4
            for (t = 0; t < TB; t++) _mm512_store_ps(keep + (o * TB + t) * 16, acc[o][t]);
        return;
    }
    ad__wgrad_store(acc, sums + (size_t)o0 * ld + ((size_t)c * kh + ki) * kw + kj0, ld,
                    G->o - o0 < OB ? G->o - o0 : OB, tb, !keep && !first);
}

/* The weight gradient of a convolution with stride and dilation 1 in one group, straight from
   the images, without im2row: for images [n0, n1) of the batch x [n, c, h, w] and the output
   gradient g [n, o, oh, ow], sums[o, k] (rows ld apart, k = (c, ki, kj)) = the sum over the
   images and output positions of g[o, oy, ox] x[c, oy + ki - ph, ox + kj - pw].
   AD__WGRAD_OUTPUTS output channels by AD__WGRAD_TAPS neighbouring taps (the taps after the last
   whole block of a row in blocks of two and one) are summed in registers, over the output
   positions of a chunk of images (ad__wgrad_chunk), from the buffers of ad__straight_inputs and
   ad__wgrad_grads in scratch (ad__straight_scratch_floats(G) values, 64-byte aligned), then
   reduced; with keep (ad__wgrad_keep_floats(G) values after them in scratch, or NULL), summed on
   over the chunks as vectors and reduced once at the end (the weight gradients of a MNIST CNN's
   two convolutions, parts of 8 images in chunks of 1 and 5, 1.1x as fast). With round, x and g
   are rounded to bfloat16 as they are copied into the buffers (a tape's bfloat16 products).
   The chunks are fixed by the geometry and n0, so the sums do not depend on the thread count. */
AD__PRIVATE __attribute__((target("avx512f"))) void ad__conv_weight_grad_avx512(const ad__win2d *G,
                                                                               const float *AD__RESTRICT x,
                                                                               const float *AD__RESTRICT g,
                                                                               int n0, int n1,
                                                                               float *AD__RESTRICT scratch,
                                                                               int keep_sums,
                                                                               float *AD__RESTRICT sums,
                                                                               size_t ld, int round)
{
    enum { OB = AD__WGRAD_OUTPUTS, TB = AD__WGRAD_TAPS };
    const int kw = G->kw, chunk = ad__wgrad_chunk(G);
    float *xs = scratch, *gs = scratch + (size_t)chunk * ad__straight_input_floats(G);
    float *kept = keep_sums ? gs + (size_t)chunk * ad__wgrad_grad_floats(G) : NULL;
    size_t b; /* the block's place among the kept sums */
    int c0, c1, o0, c, ki, kj0, first, last;
    for (c0 = n0; c0 < n1; c0 = c1) {
        c1 = n1 - c0 < chunk ? n1 : c0 + chunk;
        first = c0 == n0;
        last = c1 == n1;
        b = 0;
        ad__straight_inputs(G, x, c0, c1, xs, round);
        for (o0 = 0; o0 < G->o; o0 += OB) {
            ad__wgrad_grads(G, g, c0, c1, o0, gs, round);
            for (c = 0; c < G->c; c++)
                for (ki = 0; ki < G->kh; ki++) {
                    for (kj0 = 0; kj0 + TB <= kw; kj0 += TB, b++)
                        ad__wgrad_block(G, xs, gs, c0, c1, o0, c, ki, kj0, TB, kept, b, first, last, sums, ld);
                    for (; kj0 + 2 <= kw; kj0 += 2, b++)
                        ad__wgrad_block(G, xs, gs, c0, c1, o0, c, ki, kj0, 2, kept, b, first, last, sums, ld);
                    for (; kj0 < kw; kj0++, b++)
                        ad__wgrad_block(G, xs, gs, c0, c1, o0, c, ki, kj0, 1, kept, b, first, last, sums, ld);
                }
        }
    }
}

/* The weights w [o, c, kh, kw] packed for ad__conv_forward_avx512: for each block of
   AD__CONV_OUTPUTS output channels, tap by tap, the channels side by side (0 past the last):
   [block][tap][channel]; rounded to bfloat16 when round is set. */
AD__PRIVATE void ad__conv_pack_weights(const ad__win2d *G, const float *AD__RESTRICT w, float *AD__RESTRICT packed,
                                       int round)
{
    const int K = G->c * G->kh * G->kw;
    int o0, k, o;
    for (o0 = 0; o0 < G->o; o0 += AD__CONV_OUTPUTS)
        for (k = 0; k < K; k++)
            for (o = 0; o < AD__CONV_OUTPUTS; o++)
                *packed++ = o0 + o >= G->o ? 0 : round ? ad__bf16_round(w[(size_t)(o0 + o) * K + k])
                                                       : w[(size_t)(o0 + o) * K + k];
}

/* One step of a block of sums of the straight maps: acc[r][j] += w[r] v[j] for the first rows
   rows and vb vectors (constants where it is inlined). */
AD__HOT __attribute__((target("avx512f"))) void ad__straight_step(__m512 acc[][AD__CONV_VECTORS], const float *w,
                                                                 const __m512 *v, const int rows, const int vb)
{
    int r, j;
#pragma GCC unroll 8
    for (r = 0; r < rows; r++) {
        __m512 wv = _mm512_set1_ps(w[r]);
#pragma GCC unroll 4
        for (j = 0; j < vb; j++) acc[r][j] = _mm512_fmadd_ps(wv, v[j], acc[r][j]);
    }
}

/* One block of ad__conv_forward_avx512: output channels [o0, o0 + AD__CONV_OUTPUTS) by vb vectors
   of positions from v0 (a constant where it is inlined, so that a short last block computes only
   its own vectors), summed in registers from 0, tap after tap in im2col's order, then added to
   the bias (and to y): the GEMM's order over im2col's matrix where it sums all taps in one panel. */
AD__HOT __attribute__((target("avx512f"))) void ad__conv_forward_block(const ad__win2d *G, const float *AD__RESTRICT wk,
                                                                      const float *AD__RESTRICT xs,
                                                                      const float *AD__RESTRICT bias,
                                                                      float *AD__RESTRICT y, int n, int o0, int v0,
                                                                      const int vb, int add)
{
    enum { OB = AD__CONV_OUTPUTS, VB = AD__CONV_VECTORS };
    const int kh = G->kh, kw = G->kw, C = G->c, O = G->o, ow = G->ow;
    const size_t plane = ad__straight_plane(G), L = (size_t)G->oh * ow;
    __m512 acc[OB][VB];
    int c, ki, kj, o, j;
#pragma GCC unroll 8
    for (o = 0; o < OB; o++)
#pragma GCC unroll 4
        for (j = 0; j < vb; j++) acc[o][j] = _mm512_setzero_ps();
    for (c = 0; c < C; c++)
        for (ki = 0; ki < kh; ki++)
            for (kj = 0; kj < kw; kj++, wk += OB) {
                const float *xp = xs + ((size_t)c * kw + kj) * plane + (size_t)ki * ow + 16 * v0;
                __m512 xv[VB];
#pragma GCC unroll 4
                for (j = 0; j < vb; j++) xv[j] = _mm512_loadu_ps(xp + 16 * j);
                ad__straight_step(acc, wk, xv, OB, vb);
            }
#pragma GCC unroll 8
    for (o = 0; o < OB; o++)
#pragma GCC unroll 4
        for (j = 0; j < vb; j++) {
            size_t p = 16 * (size_t)(v0 + j);
            float *dst;
            __mmask16 lanes;
            __m512 base;
            if (o0 + o >= O) continue;
            dst = y + ((size_t)n * O + o0 + o) * L + p;
            lanes = ad__first_lanes((long long)(L - p));
            if (bias) { /* the GEMM's order: the bias (added to y) first, then the sum */
                base = _mm512_set1_ps(bias[o0 + o]);
                if (add) base = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, dst), base);
                _mm512_mask_storeu_ps(dst, lanes, _mm512_add_ps(base, acc[o][j]));
            } else {
                if (add) base = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, dst), acc[o][j]);
                _mm512_mask_storeu_ps(dst, lanes, add ? base : acc[o][j]);
            }
        }
}

/* The convolution of image n with stride and dilation 1 in one group, straight from the image,
   without im2col: y[n, o] (+)= bias[o] + the sum over taps k = (c, ki, kj) of w[o, k] times the
   input under the tap (ad__straight_inputs, built in scratch), with the weights packed by
   ad__conv_pack_weights, in blocks of AD__CONV_OUTPUTS output channels by AD__CONV_VECTORS
   vectors of positions; the vectors after the last whole block go in blocks of two and one.
   With round, the inputs are rounded to bfloat16 as they are copied (the weights were rounded
   as they were packed). */
AD__PRIVATE __attribute__((target("avx512f"))) void ad__conv_forward_avx512(const ad__win2d *G,
                                                                           const float *AD__RESTRICT x,
                                                                           const float *AD__RESTRICT packed,
                                                                           const float *AD__RESTRICT bias,
                                                                           float *AD__RESTRICT y, int n,
                                                                           float *AD__RESTRICT scratch, int add,
                                                                           int round)
{
    enum { OB = AD__CONV_OUTPUTS, VB = AD__CONV_VECTORS };
    const int vectors = ad__straight_vectors(G);
    const size_t K = (size_t)G->c * G->kh * G->kw;
    int o0, v0;
    ad__straight_inputs(G, x, n, n + 1, scratch, round);
    for (o0 = 0; o0 < G->o; o0 += OB, packed += K * OB) {
        for (v0 = 0; v0 + VB <= vectors; v0 += VB)
            ad__conv_forward_block(G, packed, scratch, bias, y, n, o0, v0, VB, add);
        for (; v0 + 2 <= vectors; v0 += 2) ad__conv_forward_block(G, packed, scratch, bias, y, n, o0, v0, 2, add);
        if (v0 < vectors) ad__conv_forward_block(G, packed, scratch, bias, y, n, o0, v0, 1, add);
    }
}

/* The weights w [o, c, kh, kw] packed for ad__conv_input_grad_avx512: for each block of
   AD__IGRAD_TAPS taps (in im2col's order), output channel after output channel, the block's taps
   side by side (0 past the last): [block][o][tap]. */
AD__PRIVATE void ad__conv_pack_taps(const ad__win2d *G, const float *AD__RESTRICT w, float *AD__RESTRICT packed)
{
    const int K = G->c * G->kh * G->kw;
    int k0, o, t;
    for (k0 = 0; k0 < K; k0 += AD__IGRAD_TAPS)
        for (o = 0; o < G->o; o++)
            for (t = 0; t < AD__IGRAD_TAPS; t++) *packed++ = k0 + t < K ? w[(size_t)o * K + k0 + t] : 0;
}

/* One block of ad__conv_input_grad_avx512: taps [k0, k0 + AD__IGRAD_TAPS) by vb vectors of
   positions from v0 (a constant where it is inlined), summed in registers over the output
   channels of one image's gradient g [o, oh * ow], then added into the planes ys where the
   forward map reads each tap's inputs (the layout of ad__straight_inputs). */
AD__HOT __attribute__((target("avx512f"))) void ad__conv_input_grad_block(const ad__win2d *G,
                                                                         const float *AD__RESTRICT wt,
                                                                         const float *AD__RESTRICT g,
                                                                         float *AD__RESTRICT ys, int k0, int v0,
                                                                         const int vb)
{
    enum { TB = AD__IGRAD_TAPS, VB = AD__CONV_VECTORS };
    const int kh = G->kh, kw = G->kw, ow = G->ow, K = G->c * kh * kw;
    const size_t plane = ad__straight_plane(G), L = (size_t)G->oh * ow;
    const float *gp = g + 16 * (size_t)v0;
    __m512 acc[TB][VB];
    __mmask16 lanes[VB];
    int o, t, j, c = k0 / (kh * kw), ki = k0 / kw % kh, kj = k0 % kw;
#pragma GCC unroll 4
    for (j = 0; j < vb; j++) lanes[j] = ad__first_lanes((long long)(L - 16 * (size_t)(v0 + j)));
#pragma GCC unroll 8
    for (t = 0; t < TB; t++)
#pragma GCC unroll 4
        for (j = 0; j < vb; j++) acc[t][j] = _mm512_setzero_ps();
    for (o = 0; o < G->o; o++, wt += TB, gp += L) {
        __m512 gv[VB];
#pragma GCC unroll 4
        for (j = 0; j < vb; j++) gv[j] = _mm512_maskz_loadu_ps(lanes[j], gp + 16 * j);
        ad__straight_step(acc, wt, gv, TB, vb);
    }
#pragma GCC unroll 8
    for (t = 0; t < TB; t++) { /* tap (c, ki, kj), stepped on without divisions */
        float *dst;
        if (k0 + t >= K) break;
        dst = ys + ((size_t)c * kw + kj) * plane + (size_t)ki * ow + 16 * (size_t)v0;
#pragma GCC unroll 4
        for (j = 0; j < vb; j++)
            _mm512_mask_storeu_ps(dst + 16 * j, lanes[j],
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(lanes[j], dst + 16 * j), acc[t][j]));
        if (++kj == kw) {
            kj = 0;
            if (++ki == kh) {
                ki = 0;
                c++;
            }
        }
    }
}

/* The adjoint of ad__straight_inputs for channels [c0, c0 + cb) of one image (cb at most
   AD__COL2IM_CHANNELS, a constant where it is inlined): adds every value of the planes ys into
   the cell of dx [c, h, w] it would have been copied from. Each run of sixteen values of an input
   row sums the kw planes' values for it in a register, for the channels side by side (their
   adds overlap, and a row shorter than sixteen values, stored with the lanes past it masked off,
   is not loaded again right after), and is stored once. A plane's values reach the lanes of a run
   at an offset of fewer than sixteen values either way, and are loaded with the lanes outside the
   row masked off (a masked load, not an expanding one: on Zen 4 the CNN's second layer's backward
   pass took 2% longer with expanding loads): ys must have sixteen values of room before
   it. */
AD__HOT __attribute__((target("avx512f"))) void ad__straight_inputs_adjoint_block(const ad__win2d *G,
                                                                                 const float *AD__RESTRICT ys,
                                                                                 float *AD__RESTRICT dx, int c0,
                                                                                 const int cb)
{
    const int h = G->h, w = G->w, ow = G->ow, kw = G->kw;
    const size_t plane = ad__straight_plane(G), channel = (size_t)kw * plane, image_plane = (size_t)h * w;
    int iy, x0, kj, b;
    for (iy = 0; iy < h; iy++)
        for (x0 = 0; x0 < w; x0 += 16) {
            const __mmask16 run = ad__first_lanes(w - x0);
            float *dst = dx + ((size_t)c0 * h + iy) * w + x0;
            const float *row = ys + c0 * channel + (size_t)(iy + G->ph) * ow;
            __m512 acc[AD__COL2IM_CHANNELS];
#pragma GCC unroll 8
            for (b = 0; b < cb; b++) acc[b] = _mm512_maskz_loadu_ps(run, dst + b * image_plane);
            for (kj = 0; kj < kw; kj++) {
                /* lane l (input column x0 + l) is read by output column col + l */
                int col = x0 + G->pw - kj, lo = col < 0 ? -col : 0, hi = ow - col < 16 ? ow - col : 16;
                const float *src;
                __mmask16 lanes;
                if (hi > w - x0) hi = w - x0;
                if (lo >= hi) continue;
                src = row + (ptrdiff_t)kj * (ptrdiff_t)plane + col;
                lanes = (__mmask16)(ad__first_lanes(hi) & ~ad__first_lanes(lo));
#pragma GCC unroll 8
                for (b = 0; b < cb; b++) acc[b] = _mm512_add_ps(acc[b], _mm512_maskz_loadu_ps(lanes, src + b * channel));
            }
#pragma GCC unroll 8
            for (b = 0; b < cb; b++) _mm512_mask_storeu_ps(dst + b * image_plane, run, acc[b]);
        }
}

AD__PRIVATE __attribute__((target("avx512f"))) void ad__straight_inputs_adjoint(const ad__win2d *G,
                                                                               const float *AD__RESTRICT ys,
                                                                               float *AD__RESTRICT dx)
{
    enum { CB = AD__COL2IM_CHANNELS };
    int c0;
    for (c0 = 0; c0 + CB <= G->c; c0 += CB) ad__straight_inputs_adjoint_block(G, ys, dx, c0, CB);
    if (c0 < G->c) ad__straight_inputs_adjoint_block(G, ys, dx, c0, G->c - c0);
}

/* The input gradient of image n straight from the output gradient g [n, o, oh, ow], without
   im2col's matrix and col2im, for a convolution ad__conv_forward_avx512 takes: dx[n] += the
   adjoint of the forward map. For each tap k = (c, ki, kj), the sum over the output channels of
   w[o, k] g[n, o] is added into the planes where the forward map reads that tap's inputs (ys, in
   scratch after sixteen values of room: ad__straight_input_floats(G) + 16 values, 64-byte
   aligned), in blocks of AD__IGRAD_TAPS taps by AD__CONV_VECTORS vectors of positions (the
   vectors after the last whole block in blocks of two and one), with the weights packed by
   ad__conv_pack_taps; the planes are then added into dx (ad__straight_inputs_adjoint). */
AD__PRIVATE __attribute__((target("avx512f"))) void ad__conv_input_grad_avx512(const ad__win2d *G,
                                                                              const float *AD__RESTRICT g,
                                                                              const float *AD__RESTRICT packed,
                                                                              float *AD__RESTRICT dx, int n,
                                                                              float *AD__RESTRICT scratch)
{
    enum { TB = AD__IGRAD_TAPS, VB = AD__CONV_VECTORS };
    const int vectors = ad__straight_vectors(G), K = G->c * G->kh * G->kw;
    const float *gn = g + (size_t)n * G->o * G->oh * G->ow;
    float *ys = scratch + 16;
    int k0, v0;
    memset(ys, 0, ad__straight_input_floats(G) * sizeof(float));
    for (k0 = 0; k0 < K; k0 += TB, packed += (size_t)G->o * TB) {
        for (v0 = 0; v0 + VB <= vectors; v0 += VB) ad__conv_input_grad_block(G, packed, gn, ys, k0, v0, VB);
        for (; v0 + 2 <= vectors; v0 += 2) ad__conv_input_grad_block(G, packed, gn, ys, k0, v0, 2);
        if (v0 < vectors) ad__conv_input_grad_block(G, packed, gn, ys, k0, v0, 1);
    }
    ad__straight_inputs_adjoint(G, ys, dx + (size_t)n * G->c * G->h * G->w);
}

/* AVX2's straight convolutions (ad__conv_forward_avx2, ad__conv_weight_grad_avx2) keep AVX-512's
   buffers: the inputs' planes, the packed weights, and the weight gradient's vectors of sixteen
   output gradients, which it takes as two halves of eight. With 16 registers, a tile is half of
   AVX-512's block of output channels (AD__STRAIGHT_AVX2_OUTPUTS) by three vectors of eight
   positions (the forward map) or three taps (the weight gradient): 12 sums, and the operands of
   one step. */

/* ad__straight_inputs without masked loads, into planes that ad__conv_kernel cleared for this map
   (a weight gradient's scratch serves the input gradient first): only each row's run inside the
   input is copied (ad__copy_run: the rows are short). Everything else in a plane, the padding
   and the room after the rows, lies at the same place for every image and stays 0. */
AD__PRIVATE void ad__straight_inputs_runs(const ad__win2d *G, const float *AD__RESTRICT x, int n0, int n1,
                                           float *AD__RESTRICT xs)
{
    const int h = G->h, w = G->w, ow = G->ow;
    const size_t plane = ad__straight_plane(G);
    int n, c, kj, r, inside, past;
    ad__straight_rows_inside(G, &inside, &past);
    for (n = n0; n < n1; n++)
        for (c = 0; c < G->c; c++) {
            const float *src = x + ((size_t)n * G->c + c) * h * w;
            for (kj = 0; kj < G->kw; kj++, xs += plane) {
                /* output columns [lo, hi) read input columns [lo + shift, hi + shift) */
                int shift = kj - G->pw, lo = shift < 0 ? -shift : 0, hi = w - shift < ow ? w - shift : ow;
                if (hi <= lo) continue; /* no input column under these outputs */
                for (r = inside; r < past; r++)
                    ad__copy_run(xs + (size_t)r * ow + lo, src + (size_t)(r - G->ph) * w + lo + shift, hi - lo);
            }
        }
}

/* ad__wgrad_grads without masked loads. */
AD__PRIVATE void ad__wgrad_grads_copy(const ad__win2d *G, const float *AD__RESTRICT g, int n0, int n1, int o0,
                                       float *AD__RESTRICT gs)
{
    enum { OB = AD__WGRAD_OUTPUTS };
    const int vectors = ad__straight_vectors(G);
    const size_t L = (size_t)G->oh * G->ow;
    int n, o, v;
    for (n = n0; n < n1; n++, gs += (size_t)vectors * OB * 16)
        for (o = 0; o < OB; o++) {
            const float *src = o0 + o < G->o ? g + ((size_t)n * G->o + o0 + o) * L : NULL;
            for (v = 0; v < vectors; v++) {
                float *dst = gs + ((size_t)v * OB + o) * 16;
                size_t p = 16 * (size_t)v, count = !src ? 0 : L - p < 16 ? L - p : 16;
                if (count == 16) { /* a copy of constant size: a few moves, not a call */
                    memcpy(dst, src + p, 16 * sizeof(float));
                    continue;
                }
                memset(dst, 0, 16 * sizeof(float));
                if (count) ad__copy_part(dst, src + p, (int)count, 16);
            }
        }
}

/* The first count of eight floats at src (0 past them), and a vector's first count lanes stored
   at dst: nothing outside them is read or written (a part goes through ad__copy_part). */
AD__INLINE __attribute__((target("avx2"))) __m256 ad__load8_part(const float *src, int count)
{
    float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (count >= 8) return _mm256_loadu_ps(src);
    ad__copy_part(t, src, count, 8);
    return _mm256_loadu_ps(t);
}

AD__INLINE __attribute__((target("avx2"))) void ad__store8_part(float *dst, __m256 v, int count)
{
    float t[8];
    if (count >= 8) {
        _mm256_storeu_ps(dst, v);
        return;
    }
    _mm256_storeu_ps(t, v);
    ad__copy_part(dst, t, count, 8);
}

/* The sum of a vector's eight lanes: halves, then quarters, then pairs added. */
AD__INLINE __attribute__((target("avx2"))) float ad__sum8_avx2(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* The sums of the lanes of a tile of ad__conv_weight_grad_avx2 (tile[o * AD__WGRAD_TAPS + t]) into
   dst[o * ld + t] (added when add is set), for the first outputs channels and taps taps. The
   tile is stored from a function of its own, given a copy of the sums, as the GEMM's are
   (AD__DEFINE_KERNEL): with the stores in the same function GCC 12 kept the sums in memory and
   moved them through it on every step. */
AD__PRIVATE __attribute__((target("avx2"))) AD__NOINLINE void ad__wgrad_store_avx2(const __m256 *tile, float *dst,
                                                                                size_t ld, int outputs, int taps,
                                                                                int add)
{
    int o, t;
    for (o = 0; o < outputs; o++)
        for (t = 0; t < taps; t++) {
            float s = ad__sum8_avx2(tile[o * AD__WGRAD_TAPS + t]);
            dst[(size_t)o * ld + t] = add ? dst[(size_t)o * ld + t] + s : s;
        }
}

/* One block of ad__conv_weight_grad_avx2: half the block's output channels, from o0 + h0, by the
   tb taps from (c, ki, kj0) (a constant where it is inlined, as in ad__wgrad_block), summed over
   the output positions of images [c0, c1), each vector of sixteen as two halves; keep[] zeroes
   the inputs past the last vector's positions. */
AD__HOT __attribute__((target("avx2,fma"))) void ad__wgrad_block_avx2(const ad__win2d *G, const float *AD__RESTRICT xs,
                                                                     const float *AD__RESTRICT gs, int c0, int c1,
                                                                     int h0, int c, int ki, int kj0, const int tb,
                                                                     const __m256 *keep, float *dst, size_t ld,
                                                                     int outputs, int add)
{
    enum { OB = AD__WGRAD_OUTPUTS, HB = AD__STRAIGHT_AVX2_OUTPUTS, TB = AD__WGRAD_TAPS };
    const int vectors = ad__straight_vectors(G);
    const size_t image_x = ad__straight_input_floats(G), image_g = ad__wgrad_grad_floats(G);
    const size_t plane = ad__straight_plane(G);
    __m256 acc[HB][TB], tile[HB * TB];
    int n, v, half, t, o;
#pragma GCC unroll 4
    for (o = 0; o < HB; o++)
#pragma GCC unroll 4
        for (t = 0; t < TB; t++) acc[o][t] = _mm256_setzero_ps();
    for (n = c0; n < c1; n++) {
        const float *gp = gs + (size_t)(n - c0) * image_g + h0 * 16;
        const float *xp = xs + (size_t)(n - c0) * image_x + ((size_t)c * G->kw + kj0) * plane + (size_t)ki * G->ow;
        for (v = 0; v < vectors; v++, xp += 16, gp += OB * 16)
            for (half = 0; half < 2; half++) {
                __m256 xv[TB];
#pragma GCC unroll 4
                for (t = 0; t < tb; t++) {
                    xv[t] = _mm256_loadu_ps(xp + 8 * half + t * plane);
                    if (v + 1 == vectors) xv[t] = _mm256_and_ps(xv[t], keep[half]);
                }
#pragma GCC unroll 4
                for (o = 0; o < HB; o++) {
                    __m256 gv = _mm256_load_ps(gp + o * 16 + 8 * half);
#pragma GCC unroll 4
                    for (t = 0; t < tb; t++) acc[o][t] = _mm256_fmadd_ps(gv, xv[t], acc[o][t]);
                }
            }
    }
#pragma GCC unroll 4
    for (o = 0; o < HB; o++)
#pragma GCC unroll 4
        for (t = 0; t < tb; t++) tile[o * TB + t] = acc[o][t];
    ad__wgrad_store_avx2(tile, dst, ld, outputs, tb, add);
}

/* ad__conv_weight_grad_avx512 with AVX2: the same chunks and buffers, each vector of sixteen
   positions as two halves, half the block's output channels at a time, the taps after the last
   whole block of a row in blocks of two and one; each sum's eight lanes are added at the end of
   a chunk. */
AD__PRIVATE __attribute__((target("avx2,fma"))) void ad__conv_weight_grad_avx2(const ad__win2d *G,
                                                                              const float *AD__RESTRICT x,
                                                                              const float *AD__RESTRICT g,
                                                                              int n0, int n1,
                                                                              float *AD__RESTRICT scratch,
                                                                              float *AD__RESTRICT sums, size_t ld)
{
    enum { OB = AD__WGRAD_OUTPUTS, HB = AD__STRAIGHT_AVX2_OUTPUTS, TB = AD__WGRAD_TAPS };
    const int kh = G->kh, kw = G->kw, O = G->o, chunk = ad__wgrad_chunk(G);
    const int vectors = ad__straight_vectors(G);
    const size_t L = (size_t)G->oh * G->ow;
    const int tail = (int)(L - 16 * (size_t)(vectors - 1)); /* positions in the last vector */
    /* lanes of the last vector's halves that hold positions: its inputs past them are zeroed,
       so that an infinite input there adds no NaN */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 keep[2] = {_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(tail), lane)),
                            _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(tail - 8), lane))};
    float *xs = scratch, *gs = scratch + (size_t)chunk * ad__straight_input_floats(G);
    int c0, c1, o0, h0, c, ki, kj0;
    for (c0 = n0; c0 < n1; c0 = c1) {
        c1 = n1 - c0 < chunk ? n1 : c0 + chunk;
        ad__straight_inputs_runs(G, x, c0, c1, xs);
        for (o0 = 0; o0 < O; o0 += OB) {
            ad__wgrad_grads_copy(G, g, c0, c1, o0, gs);
            for (h0 = 0; h0 < OB && o0 + h0 < O; h0 += HB) {
                const int outputs = O - o0 - h0 < HB ? O - o0 - h0 : HB;
                for (c = 0; c < G->c; c++)
                    for (ki = 0; ki < kh; ki++) {
                        float *dst = sums + (size_t)(o0 + h0) * ld + ((size_t)c * kh + ki) * kw;
                        for (kj0 = 0; kj0 + TB <= kw; kj0 += TB)
                            ad__wgrad_block_avx2(G, xs, gs, c0, c1, h0, c, ki, kj0, TB, keep, dst + kj0, ld, outputs,
                                                 c0 > n0);
                        for (; kj0 + 2 <= kw; kj0 += 2)
                            ad__wgrad_block_avx2(G, xs, gs, c0, c1, h0, c, ki, kj0, 2, keep, dst + kj0, ld, outputs,
                                                 c0 > n0);
                        if (kj0 < kw)
                            ad__wgrad_block_avx2(G, xs, gs, c0, c1, h0, c, ki, kj0, 1, keep, dst + kj0, ld, outputs,
                                                 c0 > n0);
                    }
            }
        }
    }
}

/* Stores a tile of ad__conv_forward_avx2 (tile[o * AD__CONV_VECTORS + j]): for each of the first
   outputs channels, y's plane L values apart, its vectors j <= last at positions p0 + 8 j on,
   each added to the bias (when given) and to y (when add is set). A function of its own, given
   a copy of the sums, for the reason ad__wgrad_store_avx2 gives. */
AD__PRIVATE __attribute__((target("avx2"))) AD__NOINLINE void ad__conv_store_avx2(const __m256 *tile,
                                                                               const float *bias, float *y,
                                                                               size_t L, size_t p0, int outputs,
                                                                               int last, int add)
{
    int o, j;
    for (o = 0; o < outputs; o++)
        for (j = 0; j <= last; j++) {
            size_t p = p0 + 8 * (size_t)j;
            float *dst = y + (size_t)o * L + p;
            int count = L - p < 8 ? (int)(L - p) : 8;
            __m256 sum = tile[o * AD__CONV_VECTORS + j], base;
            if (bias) { /* the GEMM's order: the bias (added to y) first, then the sum */
                base = _mm256_set1_ps(bias[o]);
                if (add) base = _mm256_add_ps(ad__load8_part(dst, count), base);
                ad__store8_part(dst, _mm256_add_ps(base, sum), count);
            } else {
                ad__store8_part(dst, add ? _mm256_add_ps(ad__load8_part(dst, count), sum) : sum, count);
            }
        }
}

/* One block of ad__conv_forward_avx2: half the block's output channels (outputs of them, their
   packed weights from wk, their planes from y, their biases from bias) by vb vectors of eight
   positions from v0 (a constant where it is inlined, as in ad__conv_forward_block). */
AD__HOT __attribute__((target("avx2,fma"))) void ad__conv_forward_block_avx2(const ad__win2d *G,
                                                                            const float *AD__RESTRICT wk,
                                                                            const float *AD__RESTRICT xs,
                                                                            const float *bias, float *y, int outputs,
                                                                            int v0, const int vb, int add)
{
    enum { OB = AD__CONV_OUTPUTS, HB = AD__STRAIGHT_AVX2_OUTPUTS, VB = AD__CONV_VECTORS };
    const int kh = G->kh, kw = G->kw, C = G->c, ow = G->ow;
    const size_t plane = ad__straight_plane(G);
    __m256 acc[HB][VB], tile[HB * VB];
    int c, ki, kj, o, j;
#pragma GCC unroll 4
    for (o = 0; o < HB; o++)
#pragma GCC unroll 4
        for (j = 0; j < VB; j++) acc[o][j] = _mm256_setzero_ps();
    for (c = 0; c < C; c++)
        for (ki = 0; ki < kh; ki++)
            for (kj = 0; kj < kw; kj++, wk += OB) {
                const float *xp = xs + ((size_t)c * kw + kj) * plane + (size_t)ki * ow + 8 * v0;
                __m256 xv[VB];
#pragma GCC unroll 4
                for (j = 0; j < vb; j++) xv[j] = _mm256_loadu_ps(xp + 8 * j);
#pragma GCC unroll 4
                for (o = 0; o < HB; o++) {
                    __m256 wv = _mm256_broadcast_ss(wk + o);
#pragma GCC unroll 4
                    for (j = 0; j < vb; j++) acc[o][j] = _mm256_fmadd_ps(wv, xv[j], acc[o][j]);
                }
            }
#pragma GCC unroll 4
    for (o = 0; o < HB; o++)
#pragma GCC unroll 4
        for (j = 0; j < vb; j++) tile[o * VB + j] = acc[o][j];
    ad__conv_store_avx2(tile, bias, y, (size_t)G->oh * ow, 8 * (size_t)v0, outputs, vb - 1, add);
}

/* ad__conv_forward_avx512 with AVX2: the same packed weights and inputs, half the block's output
   channels by AD__CONV_VECTORS vectors of eight positions at a time (the vectors after the last
   whole block in blocks of two and one); the same sums, in the same order, so the same bits. */
AD__PRIVATE __attribute__((target("avx2,fma"))) void ad__conv_forward_avx2(const ad__win2d *G,
                                                                          const float *AD__RESTRICT x,
                                                                          const float *AD__RESTRICT packed,
                                                                          const float *AD__RESTRICT bias,
                                                                          float *AD__RESTRICT y, int n,
                                                                          float *AD__RESTRICT scratch, int add)
{
    enum { OB = AD__CONV_OUTPUTS, HB = AD__STRAIGHT_AVX2_OUTPUTS, VB = AD__CONV_VECTORS };
    const int O = G->o;
    const size_t L = (size_t)G->oh * G->ow, K = (size_t)G->c * G->kh * G->kw;
    const int vectors = (int)((L + 7) / 8);
    int o0, h0, v0;
    ad__straight_inputs_runs(G, x, n, n + 1, scratch);
    for (o0 = 0; o0 < O; o0 += OB, packed += K * OB)
        for (h0 = 0; h0 < OB && o0 + h0 < O; h0 += HB) {
            const int outputs = O - o0 - h0 < HB ? O - o0 - h0 : HB;
            const float *b = bias ? bias + o0 + h0 : NULL;
            float *yo = y + ((size_t)n * O + o0 + h0) * L;
            for (v0 = 0; v0 + VB <= vectors; v0 += VB)
                ad__conv_forward_block_avx2(G, packed + h0, scratch, b, yo, outputs, v0, VB, add);
            for (; v0 + 2 <= vectors; v0 += 2)
                ad__conv_forward_block_avx2(G, packed + h0, scratch, b, yo, outputs, v0, 2, add);
            if (v0 < vectors) ad__conv_forward_block_avx2(G, packed + h0, scratch, b, yo, outputs, v0, 1, add);
        }
}

/* The straight maps at the processor's width: AVX-512's, or AVX2's (ad__conv_straight says when
   they are taken). round: the operands rounded to bfloat16, with AVX-512 only. */
AD__PRIVATE void ad__conv_forward_straight(const ad__win2d *G, const float *x, const float *packed,
                                           const float *bias, float *y, int n, float *scratch, int add, int round)
{
    if (ad__isa() == AD__ISA_AVX512) {
        ad__conv_forward_avx512(G, x, packed, bias, y, n, scratch, add, round);
    } else {
        AUTODIFF_ASSERT(!round);
        ad__conv_forward_avx2(G, x, packed, bias, y, n, scratch, add);
    }
}

AD__PRIVATE void ad__conv_weight_grad_straight(const ad__win2d *G, const float *x, const float *g, int n0, int n1,
                                               float *scratch, float *sums, size_t ld, int round)
{
    if (ad__isa() == AD__ISA_AVX512) {
        ad__conv_weight_grad_avx512(G, x, g, n0, n1, scratch, ad__wgrad_keep_floats(G) > 0, sums, ld, round);
    } else {
        AUTODIFF_ASSERT(!round);
        ad__conv_weight_grad_avx2(G, x, g, n0, n1, scratch, sums, ld);
    }
}
#endif

/* Multiply-adds of one image's map. */
AD__INLINE double ad__conv_image_macs(const ad__win2d *G)
{
    return (double)G->o * (G->c / G->groups) * G->kh * G->kw * G->oh * G->ow;
}

/* Are the forward map and the weight gradient taken straight from the images
   (ad__conv_forward_straight, ad__conv_weight_grad_straight): a float build on a processor with
   AVX2 or AVX-512, stride and dilation 1, one group, not a 1x1 kernel without padding (which
   reads the images in place anyway). With bfloat16 products, only with AVX-512, which rounds the
   operands as it copies them, and for at most AD__BF16_STRAIGHT_OUTPUTS output channels: with
   few, the im2col products' rows (one an output channel) fill little of a bfloat16 tile, and
   building and rounding im2col's matrix costs more than the tiles save. On a Xeon with AMX, 64
   images, the straight maps' forward and weight gradient were 1.25 to 2.4 times as fast as AMX's
   products at 32 and 64 output channels; at 128, AMX's forward map was 1.3 to 1.6 times as fast.
   The straight maps split over threads only by images (see ad__conv_by_images), so they are
   taken for images whose products would not be split anyway, or for batches of
   AD__STRAIGHT_IMAGES images or more whose im2col matrix is at most AD__STRAIGHT_FLOATS values
   (each thread then holds one, for the input gradient). The choice depends on the geometry
   alone, so results do not depend on the thread count. */
AD__INLINE int ad__conv_straight(const ad__win2d *G, int bf16)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    double patches = (double)G->c * G->kh * G->kw * G->oh * G->ow;
    if (bf16 && (ad__isa() != AD__ISA_AVX512 || G->o > AD__BF16_STRAIGHT_OUTPUTS)) return 0;
    return G->groups == 1 && G->sh == 1 && G->sw == 1 && G->dh == 1 && G->dw == 1 &&
           (G->kh > 1 || G->kw > 1 || G->ph > 0 || G->pw > 0) &&
           (ad__conv_image_macs(G) < AD__SPLIT_MACS || (G->n >= AD__STRAIGHT_IMAGES && patches <= AD__STRAIGHT_FLOATS)) &&
           ad__isa() != AD__ISA_PLAIN;
#else
    (void)G;
    (void)bf16;
    return 0;
#endif
}

/* Is the input gradient taken straight from the output gradient (ad__conv_input_grad_avx512):
   where the forward map goes straight from the images, with AVX-512, without bfloat16 products,
   for at most AD__IGRAD_MAX_OUTPUTS output channels. The output channels are the inner
   dimension of im2col's product, which with few of them does little work for its packing and
   col2im: on Zen 4 (64 images unless said, one thread) the straight input gradient was 1.25x as
   fast for 8 -> 16 channels of 12x12 (5x5), 1.23x to 1.36x for 32 output channels, 1.04x to
   1.05x for 64, and 0.94x to 0.99x for 128 (128 -> 128 of 7x7, 32 images; 64 -> 128 of 8x8). */
AD__INLINE int ad__conv_input_straight(const ad__win2d *G, int bf16)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    return !bf16 && ad__isa() == AD__ISA_AVX512 && G->o <= AD__IGRAD_MAX_OUTPUTS && ad__conv_straight(G, 0);
#else
    (void)G;
    (void)bf16;
    return 0;
#endif
}

/* One window row of im2row with bounds checks: kw values from row (NULL: a padding row) at
   x0, x0 + dw, ..., 0 where outside the input's w columns. */
AD__PRIVATE void ad__window_row(ad_real *AD__RESTRICT d, const ad_real *AD__RESTRICT row, int x0, int kw, int dw,
                                int w)
{
    int kj;
    for (kj = 0; kj < kw; kj++) {
        int ix = x0 + kj * dw;
        d[kj] = row && ix >= 0 && ix < w ? row[ix] : 0;
    }
}

/* colT [(oy1 - oy0) * ow, ld] from one image's channels for the band of output rows [oy0, oy1),
   the transpose of ad__im2col's matrix: row (oy - oy0, ox) holds the window under output
   (oy, ox) in the order (c, ki, kj), 0 in the padding.
   It is built one window row (c, ki) at a time across a row of outputs, so that the runs
   inside the input are copied by one tight loop. Such a run is copied as a block of eight
   values when the block stays inside x and what it writes past the run lands in the next
   run's slot (written after it) or in the row's last ld - K columns, which only reach columns
   of the weight gradient's product that are thrown away. */
AD__PRIVATE void ad__im2row(const ad__win2d *G, int channels, const ad_real *AD__RESTRICT x,
                            ad_real *AD__RESTRICT colT, size_t ld, int oy0, int oy1)
{
    const int kh = G->kh, kw = G->kw, dh = G->dh, dw = G->dw, h = G->h, w = G->w, ow = G->ow;
    const int sw = G->sw, pw = G->pw;
    const ad_real *x_end = x + (size_t)channels * h * w;
    int block = dw == 1 && kw <= 8 && ld - (size_t)channels * kh * kw >= (size_t)(8 - kw);
    int oy, ox, c, ki, lo, hi, lo2, hi2;
    /* the outputs whose window row lies inside the input across */
    ad__win_range(-pw, sw, w, ow, &lo, &hi);
    ad__win_range((kw - 1) * dw - pw, sw, w, ow, &lo2, &hi2);
    if (lo2 > lo) lo = lo2;
    if (hi2 < hi) hi = hi2;
    if (hi < lo) hi = lo;
    for (oy = oy0; oy < oy1; oy++)
        for (c = 0; c < channels; c++)
            for (ki = 0; ki < kh; ki++) {
                int iy = oy * G->sh - G->ph + ki * dh, blocks = lo;
                const ad_real *row = iy >= 0 && iy < h ? x + ((size_t)c * h + (size_t)iy) * w : NULL;
                ad_real *d = colT + (size_t)(oy - oy0) * ow * ld + (size_t)(c * kh + ki) * kw;
                if (!row) {
                    for (ox = 0; ox < ow; ox++, d += ld) ad__window_row(d, NULL, 0, kw, dw, w);
                    continue;
                }
                if (block && hi > lo) { /* the outputs before the first block that would read past x */
                    ptrdiff_t room = (x_end - row) - 8 + pw;
                    if ((ptrdiff_t)(hi - 1) * sw <= room) blocks = hi; /* all of them, as a rule */
                    else if (room >= 0 && room / sw + 1 > lo) blocks = (int)(room / sw + 1);
                }
                for (ox = 0; ox < lo; ox++, d += ld) ad__window_row(d, row, ox * sw - pw, kw, dw, w);
                for (; ox < blocks; ox++, d += ld) memcpy(d, row + (ox * sw - pw), 8 * sizeof(ad_real));
                for (; ox < hi; ox++, d += ld) {
                    if (dw == 1) ad__copy_run(d, row + (ox * sw - pw), kw);
                    else ad__window_row(d, row, ox * sw - pw, kw, dw, w);
                }
                for (; ox < ow; ox++, d += ld) ad__window_row(d, row, ox * sw - pw, kw, dw, w);
            }
}

/* Convolution is bilinear in (x, w). With the trilinear form L(x, w, g) = <F(x, w), g> =
   <x, Bx(g, w)> = <w, Bw(x, g)>, the three maps
       F(x, w)   the convolution                        [n, o, oh, ow]
       Bx(g, w)  its input gradient (a transposed conv) [n, c, h, w]
       Bw(x, g)  its weight gradient                    [o, c / groups, kh, kw]
   are one op here, and the derivative of each with respect to either operand is another of
   the three applied to the right pair (see ad__conv_backward). */
enum ad__conv_kind { AD__CONV_FORWARD, AD__CONV_INPUT_GRAD, AD__CONV_WEIGHT_GRAD };
static const char *const ad__conv_names[] = {
    "ad_conv2d", "ad_conv2d (input gradient)", "ad_conv2d (weight gradient)"
};

AD__PRIVATE ad_tensor *ad__conv_op(ad_tape *T, int kind, ad_tensor *a, ad_tensor *b, ad_tensor *bias,
                                   const ad__win2d *G);

/* Does the map read its input directly (a 1x1 kernel, stride 1, no padding), without im2col? */
AD__PRIVATE int ad__conv_direct(const ad__win2d *G)
{
    return G->kh == 1 && G->kw == 1 && G->sh == 1 && G->sw == 1 && G->ph == 0 && G->pw == 0;
}

/* The row length of the weight gradient's im2row matrix: K rounded up to whole panels of the
   GEMM's micro-kernel, so that the GEMM reads the matrix in place instead of packing it. */
AD__PRIVATE size_t ad__conv_row_ld(const ad__win2d *G)
{
    size_t K = (size_t)(G->c / G->groups) * G->kh * G->kw, nr = (size_t)ad__gemm_pick((int)K).nr;
    return (K + nr - 1) / nr * nr;
}

/* The images of a batch are spread over the tape's threads when each image's products are too
   small to be split themselves (or the maps go straight from the images, which split nothing
   within an image) but the batch is large enough to be worth it. The weight
   gradient sums over the images; so that the sum comes out the same for any thread count, the
   images are cut into parts fixed by the geometry alone (at most AD__CONV_SUM_PARTS), each part
   is summed in turn into its own partial sum, and the partial sums are added in order at the
   end. */
#define AD__CONV_SUM_PARTS 8

AD__PRIVATE int ad__conv_by_images(const ad__win2d *G, int straight)
{
    return !ad__conv_direct(G) && G->n >= 2 && (straight || ad__conv_image_macs(G) < AD__SPLIT_MACS) &&
           ad__conv_image_macs(G) * G->n >= AD__SPLIT_MACS;
}

/* The output rows of a band: a weight gradient's im2row matrix, ld values an output, is built
   and multiplied one band of an image's output rows at a time, so that it stays in the L1
   cache between the two (16 KiB leaves room in the 32 KiB of Zen 4's L1 for the GEMM's other
   operand; a MNIST CNN's step ran 1.07x faster than with whole images). */
#define AD__CONV_BAND_BYTES 16384

AD__PRIVATE int ad__conv_band_rows(const ad__win2d *G, size_t ld)
{
    size_t row_bytes = ld * (size_t)G->ow * sizeof(ad_real), rows = AD__CONV_BAND_BYTES / row_bytes;
    return rows < 1 ? 1 : rows > (size_t)G->oh ? G->oh : (int)rows;
}

/* Scratch of one map on the tape: per thread, one image's im2col [K, L] or im2row [L, ld], or
   for a map straight from the images its inputs, or for an input gradient straight from the
   output gradient the planes it adds into (col, col_stride values apart), and packing buffers
   (pack, NULL when the images are not spread over threads); for a weight gradient, the partial
   sums [o, ld] of each part (sums); for the forward map straight from the images, the weights
   packed by ad__conv_pack_weights (weights); for the input gradient straight from the output
   gradient (in the scratch of an input or a weight gradient: the fused backward runs both in
   one), the weights packed by ad__conv_pack_taps (taps). */
typedef struct ad__conv_scratch_t {
    ad_real *col, *pack, *sums, *weights, *taps;
    size_t col_stride;
    int threads, parts;
    int straight; /* forward and weight gradient straight from the images (ad__conv_straight) */
} ad__conv_scratch_t;

/* Fills s for map kind of geometry G (a weight gradient's scratch also serves the input
   gradient, as in the fused backward). Returns 0, or -1 with the tape's error set when memory
   runs out. A map that reads its input directly (ad__conv_direct) needs no scratch: s->col is
   NULL. */
AD__PRIVATE int ad__conv_scratch(ad_tape *T, const ad__win2d *G, const char *op, int kind, ad__conv_scratch_t *s)
{
    size_t K = (size_t)(G->c / G->groups) * G->kh * G->kw, L = (size_t)G->oh * G->ow, ld, band, col, sums;
    size_t weights = 0, taps = 0;
    int straight = ad__conv_straight(G, T->bf16), by_images = ad__conv_by_images(G, straight);
    memset(s, 0, sizeof *s);
    s->threads = s->parts = 1;
    if (ad__conv_direct(G)) return 0;
    ld = ad__conv_row_ld(G);
    if (by_images) {
        s->threads = ad__thread_count(T);
        s->parts = G->n < AD__CONV_SUM_PARTS ? G->n : AD__CONV_SUM_PARTS;
    }
    /* whole 64-byte lines per thread, so every thread's scratch stays aligned */
    band = (size_t)ad__conv_band_rows(G, ld) * G->ow;
    col = K * L > band * ld ? K * L : band * ld;
    if (straight && kind == AD__CONV_WEIGHT_GRAD && col < ad__straight_scratch_floats(G))
        col = ad__straight_scratch_floats(G);
    if (straight && kind == AD__CONV_FORWARD) {
        if (col < ad__straight_input_floats(G)) col = ad__straight_input_floats(G);
        weights = (size_t)(G->o + AD__CONV_OUTPUTS - 1) / AD__CONV_OUTPUTS * AD__CONV_OUTPUTS * K;
    }
    if (kind != AD__CONV_FORWARD && ad__conv_input_straight(G, T->bf16)) {
        if (col < ad__straight_input_floats(G) + 16) col = ad__straight_input_floats(G) + 16;
        taps = (K + AD__IGRAD_TAPS - 1) / AD__IGRAD_TAPS * AD__IGRAD_TAPS * G->o;
    }
    col = (col + 15) / 16 * 16;
    sums = kind == AD__CONV_WEIGHT_GRAD ? (size_t)s->parts * G->o * ld : 0;
    s->col_stride = col;
    s->col = (ad_real *)ad__alloc(T, (col * (size_t)s->threads + sums + weights + taps) * sizeof(ad_real), op);
    if (!s->col) return -1;
    s->sums = sums ? s->col + col * (size_t)s->threads : NULL;
    s->weights = weights ? s->col + col * (size_t)s->threads + sums : NULL;
    s->taps = taps ? s->col + col * (size_t)s->threads + sums + weights : NULL;
    s->straight = straight;
    if (by_images && (s->pack = ad__gemm_buffers(T, s->threads, 0)) == NULL) {
        ad__fail(T, "%s: out of memory for the packing buffer", op);
        return -1;
    }
    return 0;
}

/* One map over a batch: the operands are (x, w) for the forward map, (g, w) for Bx and (x, g)
   for Bw; out (+)= the map (+ bias for the forward map), added into out when add is set. */
typedef struct ad__conv_job {
    ad_tape *T;
    const ad__win2d *G;
    int kind, add;
    const ad_real *a, *b, *bias;
    ad_real *out;
    const ad__conv_scratch_t *s;
    int failed;
} ad__conv_job;

/* A product of the map on this thread's packing buffers, or, without them, through ad__gemm,
   which may split it over threads. Returns 0, or -1 when packing buffers cannot be allocated. */
AD__PRIVATE int ad__conv_gemm(ad_tape *T, ad_real *pack, int ta, int tb, int M, int N, int K, const ad_real *A,
                              ptrdiff_t lda, const ad_real *B, ptrdiff_t ldb, ad_real *C, ptrdiff_t ldc, int accumulate)
{
    if (!pack) return ad__gemm(T, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    ad__gemm_alone(T->bf16, pack, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return 0;
}

/* Image n of the map, every group: the forward map straight from the image, or the input
   gradient straight from the output gradient, where the scratch says so, or one GEMM around
   im2col / col2im in col, or for a weight gradient one GEMM a band of output rows
   (ad__conv_band_rows) after im2row. A weight
   gradient's sums go into sums, rows ld long: stored for the first image of a part, added for
   the others. Returns 0, or -1 when packing buffers cannot be allocated. */
AD__PRIVATE int ad__conv_image(const ad__conv_job *j, int n, ad_real *col, ad_real *pack, ad_real *sums, int first)
{
    const ad__win2d *G = j->G;
    int cg = G->c / G->groups, og = G->o / G->groups, L = G->oh * G->ow, K = cg * G->kh * G->kw;
    int g, r, rc = 0;
    size_t HW = (size_t)G->h * G->w, ld = col ? ad__conv_row_ld(G) : 0;
    for (g = 0; g < G->groups && rc == 0; g++) {
        size_t xoff = ((size_t)n * G->c + (size_t)g * cg) * HW;
        size_t yoff = ((size_t)n * G->o + (size_t)g * og) * (size_t)L;
        size_t woff = (size_t)g * og * (size_t)K;
        const ad_real *src;
        if (j->kind == AD__CONV_FORWARD && j->s->weights) {
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
            ad__conv_forward_straight(G, j->a, j->s->weights, j->bias, j->out, n, col, j->add, j->T->bf16 != 0);
#endif
        } else if (j->kind == AD__CONV_FORWARD) {
            /* y[og, L] (+)= w[og, K] col[K, L] (+ bias) */
            ad_real *yg = j->out + yoff;
            src = j->a + xoff;
            if (col) {
                ad__im2col(G, cg, src, col);
                src = col;
            }
            if (j->bias)
                for (r = 0; r < og; r++) ad__nn_fill(yg + (size_t)r * L, j->bias[g * og + r], (size_t)L, j->add);
            rc = ad__conv_gemm(j->T, pack, 0, 0, og, L, K, j->b + woff, K, src, L, yg, L, j->add || j->bias);
        } else if (j->kind == AD__CONV_INPUT_GRAD && j->s->taps) {
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
            ad__conv_input_grad_avx512(G, j->a, j->s->taps, j->out, n, col);
#endif
        } else if (j->kind == AD__CONV_INPUT_GRAD) {
            /* col[K, L] = w[og, K]^T g[og, L], added back into the image */
            if (!col) {
                rc = ad__conv_gemm(j->T, pack, 1, 0, K, L, og, j->b + woff, K, j->a + yoff, L, j->out + xoff, L, j->add);
            } else {
                rc = ad__conv_gemm(j->T, pack, 1, 0, K, L, og, j->b + woff, K, j->a + yoff, L, col, L, 0);
                if (!ad__col2im_wide(G, cg, col, j->out + xoff)) ad__col2im(G, cg, col, j->out + xoff);
            }
        } else if (col) {
            /* w[og, K] (+)= g[og, L] colT[L, K]: with im2row's layout the large operand is the
               GEMM's B, read in place */
            int oy0, oy1, rows = ad__conv_band_rows(G, ld);
            for (oy0 = 0; oy0 < G->oh && rc == 0; oy0 = oy1) {
                oy1 = oy0 + rows < G->oh ? oy0 + rows : G->oh;
                ad__im2row(G, cg, j->a + xoff, col, ld, oy0, oy1);
                rc = ad__conv_gemm(j->T, pack, 0, 0, og, (int)ld, (oy1 - oy0) * G->ow,
                                   j->b + yoff + (size_t)oy0 * G->ow, L, col, (ptrdiff_t)ld,
                                   sums + (size_t)g * og * ld, (ptrdiff_t)ld, !first || oy0 > 0);
            }
        } else {
            /* w[og, K] (+)= g[og, L] x[K, L]^T, summed over the images */
            rc = ad__conv_gemm(j->T, pack, 0, 1, og, K, L, j->b + yoff, L, j->a + xoff, L, j->out + woff, K,
                               j->add || !first);
        }
    }
    return rc;
}

/* Task: one image, or for a weight gradient (im2row) one part of the images. */
AD__PRIVATE void ad__conv_task(void *ctx, int task, int thread)
{
    ad__conv_job *j = (ad__conv_job *)ctx;
    const ad__conv_scratch_t *s = j->s;
    ad_real *col = s->col ? s->col + (size_t)thread * s->col_stride : NULL;
    ad_real *pack = s->pack ? s->pack + (size_t)thread * AD__PACK_PER_THREAD : NULL;
    int n, rc = 0;
    if (j->kind == AD__CONV_WEIGHT_GRAD && col) {
        int lo = (int)((long long)task * j->G->n / s->parts), hi = (int)((long long)(task + 1) * j->G->n / s->parts);
        ad_real *sums = s->sums + (size_t)task * j->G->o * ad__conv_row_ld(j->G);
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
        if (s->straight) {
            ad__conv_weight_grad_straight(j->G, j->a, j->b, lo, hi, col, sums, ad__conv_row_ld(j->G), j->T->bf16 != 0);
            return;
        }
#endif
        for (n = lo; n < hi && rc == 0; n++) rc = ad__conv_image(j, n, col, pack, sums, n == lo);
    } else {
        rc = ad__conv_image(j, task, col, pack, NULL, task == 0);
    }
    if (rc) j->failed = 1; /* only without packing buffers, so only when the tasks run in turn */
}

/* out (+)= the map kind of (a, b) over the batch, with scratch s from ad__conv_scratch. Returns
   0, or -1 when the GEMM's packing buffer cannot be allocated. */
AD__PRIVATE int ad__conv_kernel(ad_tape *T, int kind, const ad__win2d *G, const ad_real *a, const ad_real *b,
                                const ad_real *bias, ad_real *out, int add, const ad__conv_scratch_t *s)
{
    int K = (G->c / G->groups) * G->kh * G->kw, r, k, t, p, n;
    size_t ld = s->col ? ad__conv_row_ld(G) : 0;
    int band = s->col ? ad__conv_band_rows(G, ld) * G->ow : 0; /* im2row's rows */
    ad__conv_job job;
    job.T = T; job.G = G; job.kind = kind; job.add = add;
    job.a = a; job.b = b; job.bias = bias; job.out = out;
    job.s = s;
    job.failed = 0;
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    if (kind == AD__CONV_FORWARD && s->weights) ad__conv_pack_weights(G, b, s->weights, T->bf16 != 0);
    if (kind == AD__CONV_INPUT_GRAD && s->taps) ad__conv_pack_taps(G, b, s->taps);
#endif
    if (kind == AD__CONV_INPUT_GRAD && s->col && !add)
        memset(out, 0, (size_t)G->n * G->c * G->h * G->w * sizeof(ad_real));
    if (kind != AD__CONV_INPUT_GRAD && s->straight) { /* the input planes: their zeros stay for this map */
        size_t planes = ad__straight_input_floats(G) * (kind == AD__CONV_FORWARD ? 1 : (size_t)ad__wgrad_chunk(G));
        for (t = 0; t < s->threads; t++) memset(s->col + (size_t)t * s->col_stride, 0, planes * sizeof(ad_real));
    }
    if (kind == AD__CONV_WEIGHT_GRAD && s->col && !s->straight)
        for (t = 0; t < s->threads; t++) /* im2row's padding columns: defined values from the start */
            for (r = 0; r < band; r++)
                memset(s->col + (size_t)t * s->col_stride + (size_t)r * ld + K, 0, (ld - (size_t)K) * sizeof(ad_real));
    if (s->pack) {
        ad__parallel(T, ad__conv_task, &job, kind == AD__CONV_WEIGHT_GRAD ? s->parts : G->n);
    } else if (kind == AD__CONV_WEIGHT_GRAD && s->col) {
        ad__conv_task(&job, 0, 0); /* one part: every image, in turn */
    } else {
        for (n = 0; n < G->n && !job.failed; n++) ad__conv_task(&job, n, 0);
    }
    if (job.failed) return -1;
    if (kind == AD__CONV_WEIGHT_GRAD && s->col)
        for (r = 0; r < G->o; r++)
            for (k = 0; k < K; k++) {
                ad_real sum = add ? out[(size_t)r * K + k] : 0;
                for (p = 0; p < s->parts; p++) sum += s->sums[((size_t)p * G->o + r) * ld + k];
                out[(size_t)r * K + k] = sum;
            }
    return 0;
}

/* The gradients of a forward convolution when they are not recorded: each computed straight
   into the buffer that accumulates it. */
AD__PRIVATE void ad__conv_backward_fused(ad__sweep *S, ad__node *n, ad_tensor *v)
{
    ad_tape *T = S->T;
    const ad__win2d *G = ad__win_of(n);
    ad_tensor *x = n->in[0], *w = n->in[1], *bias = n->nin > 2 ? n->in[2] : NULL;
    ad__conv_scratch_t scratch;
    ad_real *d;
    int add, failed = 0, o, k;
    size_t L = (size_t)G->oh * G->ow;
    if (ad__wants(S, x) || ad__wants(S, w))
        failed = ad__conv_scratch(T, G, "ad_conv2d", ad__wants(S, w) ? AD__CONV_WEIGHT_GRAD : AD__CONV_INPUT_GRAD,
                                  &scratch) != 0;
    if (!failed && ad__wants(S, x) && (d = ad__grad_target(S, x, &add)) != NULL)
        failed = ad__conv_kernel(T, AD__CONV_INPUT_GRAD, G, v->data, w->data, NULL, d, add, &scratch) != 0;
    if (!failed && ad__wants(S, w) && (d = ad__grad_target(S, w, &add)) != NULL)
        failed = ad__conv_kernel(T, AD__CONV_WEIGHT_GRAD, G, x->data, v->data, NULL, d, add, &scratch) != 0;
    if (!failed && bias && ad__wants(S, bias) && (d = ad__grad_target(S, bias, &add)) != NULL) {
        if (!add) memset(d, 0, (size_t)G->o * sizeof(ad_real));
        for (k = 0; k < G->n; k++)
            for (o = 0; o < G->o; o++) d[o] += ad__nn_sum(v->data + ((size_t)k * G->o + o) * L, L);
    }
    if (failed) {
        S->failed = 1;
        if (!T->has_error) ad__fail(T, "ad_conv2d: out of memory in the backward sweep");
    }
}

/* v is the gradient of this op's output. */
AD__PRIVATE void ad__conv_backward(ad__sweep *S, ad__node *n, ad_tensor *v)
{
    ad_tape *T = S->T;
    const ad__win2d *G = ad__win_of(n);
    ad_tensor *a = n->in[0], *b = n->in[1];
    int shape[3];
    switch (n->st.conv.kind) {
    case AD__CONV_FORWARD: /* y = F(x, w) + bias: dx = Bx(v, w), dw = Bw(x, v), dbias = sum v */
        if (!S->create_graph) {
            ad__conv_backward_fused(S, n, v);
            break;
        }
        if (ad__wants(S, a)) ad__accum(S, a, ad__conv_op(T, AD__CONV_INPUT_GRAD, v, b, NULL, G), 1);
        if (ad__wants(S, b)) ad__accum(S, b, ad__conv_op(T, AD__CONV_WEIGHT_GRAD, a, v, NULL, G), 1);
        if (n->nin > 2 && ad__wants(S, n->in[2])) {
            shape[0] = G->o;
            shape[1] = shape[2] = 1;
            ad__accum_to(S, n->in[2], ad_sum_to(T, v, 3, shape), 1);
        }
        break;
    case AD__CONV_INPUT_GRAD: /* z = Bx(g, w): <z, v> = <F(v, w), g> = <w, Bw(v, g)> */
        if (ad__wants(S, a)) ad__accum(S, a, ad__conv_op(T, AD__CONV_FORWARD, v, b, NULL, G), 1);
        if (ad__wants(S, b)) ad__accum(S, b, ad__conv_op(T, AD__CONV_WEIGHT_GRAD, v, a, NULL, G), 1);
        break;
    case AD__CONV_WEIGHT_GRAD: /* z = Bw(x, g): <z, v> = <x, Bx(g, v)> = <F(x, v), g> */
        if (ad__wants(S, a)) ad__accum(S, a, ad__conv_op(T, AD__CONV_INPUT_GRAD, b, v, NULL, G), 1);
        if (ad__wants(S, b)) ad__accum(S, b, ad__conv_op(T, AD__CONV_FORWARD, a, v, NULL, G), 1);
        break;
    default: AUTODIFF_ASSERT(0);
    }
}

/* One of the three maps as a recorded op; G has been validated by ad_conv2d. */
AD__PRIVATE ad_tensor *ad__conv_op(ad_tape *T, int kind, ad_tensor *a, ad_tensor *b, ad_tensor *bias,
                                   const ad__win2d *G)
{
    const char *op = ad__conv_names[kind];
    int shape[4];
    ad__conv_scratch_t scratch;
    ad_tensor *y, *ins[3];
    ad__node *node;
    if (!a || !b) return NULL;
    if (kind == AD__CONV_FORWARD) {
        shape[0] = G->n; shape[1] = G->o; shape[2] = G->oh; shape[3] = G->ow;
    } else if (kind == AD__CONV_INPUT_GRAD) {
        shape[0] = G->n; shape[1] = G->c; shape[2] = G->h; shape[3] = G->w;
    } else {
        shape[0] = G->o; shape[1] = G->c / G->groups; shape[2] = G->kh; shape[3] = G->kw;
    }
    y = ad__tensor(T, op, 4, shape, 1);
    if (!y) return NULL;
    if (ad__conv_scratch(T, G, op, kind, &scratch) != 0) return NULL;
    if (ad__conv_kernel(T, kind, G, a->data, b->data, bias ? bias->data : NULL, y->data, 0, &scratch) != 0) {
        ad__fail(T, "%s: out of memory for the packing buffer", op);
        return NULL;
    }
    ins[0] = a;
    ins[1] = b;
    ins[2] = bias;
    node = ad__record(T, op, y, ad__conv_backward, ins, bias ? 3 : 2);
    if (!node) return NULL;
    node->st.conv.kind = kind;
    if (!ad__win_save(T, node, G, op)) return NULL;
    return y;
}

AUTODIFF_API ad_tensor *ad_conv2d(ad_tape *T, ad_tensor *x, ad_tensor *w, ad_tensor *b,
                                  const ad_conv2d_desc *desc)
{
    ad_conv2d_desc d;
    ad__win2d G;
    long long ph2, pw2, eh, ew, oh, ow;
    char sx[96], sw[96], sb[96];
    if (!T || !x || !w) return NULL;
    if (!ad__on_tape(T, "ad_conv2d", "x", x) || !ad__on_tape(T, "ad_conv2d", "w", w) ||
        (b && !ad__on_tape(T, "ad_conv2d", "b", b)))
        return NULL;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    ad_shape_str(x, sx, sizeof sx);
    ad_shape_str(w, sw, sizeof sw);
    if (x->ndim != 4 || w->ndim != 4) {
        ad__fail(T, "ad_conv2d: x %s, w %s: x must be [N, C, H, W] and w [O, C/groups, kH, kW]", sx, sw);
        return NULL;
    }
    if (d.stride_h < 0 || d.stride_w < 0 || d.dilation_h < 0 || d.dilation_w < 0) {
        ad__fail(T, "ad_conv2d: x %s, w %s: stride %dx%d and dilation %dx%d must be positive (0 means 1)",
                 sx, sw, d.stride_h, d.stride_w, d.dilation_h, d.dilation_w);
        return NULL;
    }
    if (d.pad_h < 0 || d.pad_w < 0) {
        ad__fail(T, "ad_conv2d: x %s, w %s: padding %dx%d must not be negative", sx, sw, d.pad_h, d.pad_w);
        return NULL;
    }
    if (d.groups < 0) {
        ad__fail(T, "ad_conv2d: x %s, w %s: groups %d must be positive (0 means 1)", sx, sw, d.groups);
        return NULL;
    }
    memset(&G, 0, sizeof G);
    G.n = x->shape[0]; G.c = x->shape[1]; G.h = x->shape[2]; G.w = x->shape[3];
    G.o = w->shape[0]; G.kh = w->shape[2]; G.kw = w->shape[3];
    G.sh = d.stride_h ? d.stride_h : 1;
    G.sw = d.stride_w ? d.stride_w : 1;
    G.dh = d.dilation_h ? d.dilation_h : 1;
    G.dw = d.dilation_w ? d.dilation_w : 1;
    G.ph = d.pad_h;
    G.pw = d.pad_w;
    G.groups = d.groups ? d.groups : 1;
    if (G.c % G.groups != 0 || G.o % G.groups != 0) {
        ad__fail(T, "ad_conv2d: x %s, w %s: groups %d must divide both the %d input channels and the %d "
                 "output channels", sx, sw, G.groups, G.c, G.o);
        return NULL;
    }
    if (w->shape[1] != G.c / G.groups) {
        ad__fail(T, "ad_conv2d: x %s, w %s: w has %d input channels per group; x's %d channels in %d "
                 "group(s) need %d", sx, sw, w->shape[1], G.c, G.groups, G.c / G.groups);
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != G.o)) {
        ad__fail(T, "ad_conv2d: w %s, b %s: b must be [%d], one value per output channel", sw,
                 ad_shape_str(b, sb, sizeof sb), G.o);
        return NULL;
    }
    ph2 = (long long)G.h + 2LL * G.ph;
    pw2 = (long long)G.w + 2LL * G.pw;
    eh = (long long)G.dh * (G.kh - 1) + 1;
    ew = (long long)G.dw * (G.kw - 1) + 1;
    if (eh > ph2 || ew > pw2) {
        ad__fail(T, "ad_conv2d: x %s, w %s: the kernel spans %lldx%lld (dilation %dx%d), larger than the "
                 "padded input %lldx%lld: the output would be empty", sx, sw, eh, ew, G.dh, G.dw, ph2, pw2);
        return NULL;
    }
    oh = (ph2 - eh) / G.sh + 1;
    ow = (pw2 - ew) / G.sw + 1;
    if (ph2 > INT_MAX || pw2 > INT_MAX || oh * ow > INT_MAX ||
        (long long)(G.c / G.groups) * G.kh * G.kw > INT_MAX) {
        ad__fail(T, "ad_conv2d: x %s, w %s: too large", sx, sw);
        return NULL;
    }
    G.oh = (int)oh;
    G.ow = (int)ow;
    return ad__conv_op(T, AD__CONV_FORWARD, x, w, b, &G);
}

/* >>ops:pool --------------------------------------------------------------------------------- */
/* Checks a pooling call and fills G; 0 with the tape's error set on a misuse. */
AD__PRIVATE int ad__pool_geom(ad_tape *T, const char *op, const ad_tensor *x, int kh, int kw,
                              const ad_pool2d_desc *desc, ad__win2d *G)
{
    ad_pool2d_desc d;
    long long ph2, pw2;
    char s[96];
    if (!ad__on_tape(T, op, "the input", x)) return 0;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    ad_shape_str(x, s, sizeof s);
    if (x->ndim != 4) {
        ad__fail(T, "%s: x %s must be [N, C, H, W]", op, s);
        return 0;
    }
    if (kh < 1 || kw < 1 || d.stride_h < 0 || d.stride_w < 0) {
        ad__fail(T, "%s: x %s: kernel %dx%d and stride %dx%d must be positive (stride 0 means the kernel)",
                 op, s, kh, kw, d.stride_h, d.stride_w);
        return 0;
    }
    if (d.pad_h < 0 || d.pad_w < 0 || d.pad_h > kh / 2 || d.pad_w > kw / 2) {
        ad__fail(T, "%s: x %s: padding %dx%d must be between 0 and half the kernel %dx%d", op, s, d.pad_h,
                 d.pad_w, kh, kw);
        return 0;
    }
    memset(G, 0, sizeof *G);
    G->n = x->shape[0]; G->c = G->o = x->shape[1]; G->h = x->shape[2]; G->w = x->shape[3];
    G->kh = kh; G->kw = kw;
    G->sh = d.stride_h ? d.stride_h : kh;
    G->sw = d.stride_w ? d.stride_w : kw;
    G->ph = d.pad_h; G->pw = d.pad_w;
    G->dh = G->dw = 1;
    G->groups = 1;
    G->exclude_pad = d.exclude_pad != 0;
    ph2 = (long long)G->h + 2LL * G->ph;
    pw2 = (long long)G->w + 2LL * G->pw;
    if (kh > ph2 || kw > pw2) {
        ad__fail(T, "%s: x %s: the kernel %dx%d is larger than the padded input %lldx%lld: the output would "
                 "be empty", op, s, kh, kw, ph2, pw2);
        return 0;
    }
    if (ph2 > INT_MAX || pw2 > INT_MAX || (size_t)G->h * (size_t)G->w > INT_MAX) {
        ad__fail(T, "%s: x %s: too large", op, s);
        return 0;
    }
    G->oh = (int)((ph2 - kh) / G->sh + 1);
    G->ow = (int)((pw2 - kw) / G->sw + 1);
    return 1;
}

/* Row oy of max pooling one output at a time, for rows that hold a NaN: the first real cell
   of each window, then any larger one or a NaN replacing a number (a NaN wins and stays, as in
   PyTorch). */
AD__PRIVATE void ad__max_pool_row_nan(const ad__win2d *G, const ad_real *x, int oy, ad_real *m, int *a)
{
    int ox, iy, ix;
    int ys = oy * G->sh - G->ph, y0 = ys < 0 ? 0 : ys, y1 = ys + G->kh < G->h ? ys + G->kh : G->h;
    for (ox = 0; ox < G->ow; ox++) {
        int xs = ox * G->sw - G->pw, x0 = xs < 0 ? 0 : xs, x1 = xs + G->kw < G->w ? xs + G->kw : G->w;
        int best = y0 * G->w + x0;
        ad_real v, mv = x[best];
        for (iy = y0; iy < y1; iy++)
            for (ix = x0; ix < x1; ix++) {
                v = x[iy * G->w + ix];
                if ((v > mv || v != v) && mv == mv) {
                    mv = v;
                    best = iy * G->w + ix;
                }
            }
        m[ox] = mv;
        if (a) a[ox] = best;
    }
}

/* One plane of max pooling: y [oh, ow] from x [h, w], and when arg is not NULL the winners'
   positions in x (the first maximal cell of each window in row-major order). The taps of the
   window are visited over a whole output row at a time, so that the inner loops are selects
   without branches: first the maxima, then, taps in reverse, the first cell holding each one.
   Padded cells are never read, and every window has a real cell (padding is at most half the
   kernel). range[2 kj], range[2 kj + 1] are the outputs whose tap kj falls inside a row. */
AD__PRIVATE void ad__max_pool_plane(const ad__win2d *G, const int *range, const ad_real *AD__RESTRICT x,
                                    ad_real *AD__RESTRICT y, int *AD__RESTRICT arg)
{
    int oy, ox, ki, kj, lo, hi;
    for (oy = 0; oy < G->oh; oy++) {
        ad_real *AD__RESTRICT m = y + (size_t)oy * G->ow;
        int *AD__RESTRICT a = arg ? arg + (size_t)oy * G->ow : NULL;
        int nan = 0;
        for (ox = 0; ox < G->ow; ox++) m[ox] = (ad_real)-HUGE_VAL;
        for (ki = 0; ki < G->kh; ki++) {
            int iy = oy * G->sh - G->ph + ki;
            if (iy < 0 || iy >= G->h) continue;
            for (kj = 0; kj < G->kw; kj++) {
                int off = kj - G->pw;
                const ad_real *row = x + (size_t)iy * G->w;
                lo = range[2 * kj];
                hi = range[2 * kj + 1];
                for (ox = lo; ox < hi; ox++) {
                    ad_real v = row[ox * G->sw + off], cur = m[ox];
                    m[ox] = v > cur ? v : cur;
                    nan |= v != v;
                }
            }
        }
        if (nan) {
            ad__max_pool_row_nan(G, x, oy, m, a);
            continue;
        }
        if (!a) continue;
        for (ki = G->kh - 1; ki >= 0; ki--) {
            int iy = oy * G->sh - G->ph + ki;
            if (iy < 0 || iy >= G->h) continue;
            for (kj = G->kw - 1; kj >= 0; kj--) {
                int off = kj - G->pw, base = iy * G->w + off;
                lo = range[2 * kj];
                hi = range[2 * kj + 1];
                for (ox = lo; ox < hi; ox++) {
                    int at = base + ox * G->sw, eq = -(int)(x[at] == m[ox]);
                    a[ox] = (a[ox] & ~eq) | (at & eq);
                }
            }
        }
    }
}

/* Windows of 2x2 with stride 2 and no padding: side by side, each input cell in at most one. */
AD__INLINE int ad__pool_2x2(const ad__win2d *G)
{
    return G->kh == 2 && G->kw == 2 && G->sh == 2 && G->sw == 2 && G->ph == 0 && G->pw == 0;
}

/* One 2x2 window (p q / u v): its maximum, the winner's offset in the window (0, 1, w or
   w + 1: the first maximal cell, picked by masks rather than branches, which random data would
   mispredict) and whether the window holds a NaN (or infinities that cancel: then the exact
   row path decides). */
AD__INLINE ad_real ad__max_2x2(ad_real p, ad_real q, ad_real u, ad_real v, int w, int *at, int *nan)
{
    ad_real top = q > p ? q : p, bottom = v > u ? v : u, sum = (p + q) + (u + v);
    int below = -(bottom > top);
    *at = ((w + (v > u)) & below) | ((int)(q > p) & ~below);
    *nan = sum != sum;
    return bottom > top ? bottom : top;
}

/* The common 2x2 window with stride 2 and no padding: the same result as ad__max_pool_plane.
   Outputs go in blocks of four with constant trip counts, which compilers vectorise. */
AD__PRIVATE void ad__max_pool_plane_2x2(const ad__win2d *G, const ad_real *AD__RESTRICT x,
                                        ad_real *AD__RESTRICT y, int *AD__RESTRICT arg)
{
    int oy, ox, j, w = G->w, ow = G->ow;
    for (oy = 0; oy < G->oh; oy++) {
        const ad_real *r0 = x + (size_t)(2 * oy) * w, *r1 = r0 + w;
        ad_real *AD__RESTRICT m = y + (size_t)oy * ow;
        int *AD__RESTRICT a = arg ? arg + (size_t)oy * ow : NULL, nan = 0;
        for (ox = 0; ox < ow; ox += 4) {
            int at[4], bad[4] = {0, 0, 0, 0}, n = ow - ox < 4 ? ow - ox : 4;
            if (n == 4) {
                for (j = 0; j < 4; j++)
                    m[ox + j] = ad__max_2x2(r0[2 * (ox + j)], r0[2 * (ox + j) + 1], r1[2 * (ox + j)],
                                            r1[2 * (ox + j) + 1], w, &at[j], &bad[j]);
            } else {
                for (j = 0; j < n; j++)
                    m[ox + j] = ad__max_2x2(r0[2 * (ox + j)], r0[2 * (ox + j) + 1], r1[2 * (ox + j)],
                                            r1[2 * (ox + j) + 1], w, &at[j], &bad[j]);
            }
            nan |= bad[0] | bad[1] | bad[2] | bad[3];
            if (a)
                for (j = 0; j < n; j++) a[ox + j] = 2 * (oy * w + ox + j) + at[j];
        }
        if (nan) ad__max_pool_row_nan(G, x, oy, m, a);
    }
}

#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
/* The masks of a block of n <= 16 windows of 2x2 pooling: one lane a window (*one), and the
   lanes of its 2n columns in the two vectors of a row that hold them (*lo, *hi). */
AD__INLINE void ad__pool_block_masks(int n, __mmask16 *one, __mmask16 *lo, __mmask16 *hi)
{
    *one = (__mmask16)((1u << n) - 1);
    *lo = n >= 8 ? 0xFFFF : (__mmask16)((1u << 2 * n) - 1);
    *hi = n <= 8 ? 0 : n == 16 ? 0xFFFF : (__mmask16)((1u << (2 * n - 16)) - 1);
}

/* A block's 2n columns of one input row, from r on: the windows' left cells into *left and
   right cells into *right, a lane a window. */
AD__INLINE AD__ALWAYS_INLINE __attribute__((target("avx512f"))) void
ad__pool_row_pairs(const float *r, __mmask16 lo, __mmask16 hi, __m512 *left, __m512 *right)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    __m512 a = _mm512_maskz_loadu_ps(lo, r), b = _mm512_maskz_loadu_ps(hi, r + 16);
    *left = _mm512_permutex2var_ps(a, even, b);
    *right = _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
}

/* The inverse of ad__pool_row_pairs: the windows' left and right cells stored side by side in
   the block's 2n columns of a row, from r on. */
AD__INLINE AD__ALWAYS_INLINE __attribute__((target("avx512f"))) void
ad__pool_row_store_pairs(float *r, __mmask16 lo, __mmask16 hi, __m512 left, __m512 right)
{
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
    _mm512_mask_storeu_ps(r, lo, _mm512_permutex2var_ps(left, first, right));
    _mm512_mask_storeu_ps(r + 16, hi, _mm512_permutex2var_ps(left, second, right));
}

/* The first input cell of each window of a block, 2 (first + lane), where first is oy w + ox
   for the block's first window (oy, ox) of a plane w wide. */
AD__INLINE AD__ALWAYS_INLINE __attribute__((target("avx512f"))) __m512i ad__pool_block_cells(int first)
{
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_slli_epi32(_mm512_add_epi32(_mm512_set1_epi32(first), lanes), 1);
}

/* ad__max_pool_plane_2x2 with AVX-512, sixteen windows at a time: the same maxima, winners and
   NaN rows. A row's 32 inputs are split into their even and odd columns by two permutes, and a
   last part block is read and written under masks, so nothing outside the plane is touched.
   The portable loop, which compilers vectorise four windows wide, took 2.2 to 2.6 times as long
   as ReLU over the same input. */
AD__PRIVATE __attribute__((target("avx512f"))) void
ad__max_pool_plane_2x2_avx512(const ad__win2d *G, const float *AD__RESTRICT x, float *AD__RESTRICT y,
                              int *AD__RESTRICT arg)
{
    const __m512i one = _mm512_set1_epi32(1);
    int oy, ox, w = G->w, ow = G->ow;
    for (oy = 0; oy < G->oh; oy++) {
        const float *r0 = x + (size_t)(2 * oy) * w, *r1 = r0 + w;
        float *m = y + (size_t)oy * ow;
        int *a = arg ? arg + (size_t)oy * ow : NULL, nan = 0;
        for (ox = 0; ox < ow; ox += 16) {
            __mmask16 out, lo, hi, right_top, right_bottom, below;
            __m512 p, q, u, v, top, bottom, sum;
            __m512i at_top, at_bottom;
            ad__pool_block_masks(ow - ox < 16 ? ow - ox : 16, &out, &lo, &hi);
            ad__pool_row_pairs(r0 + 2 * ox, lo, hi, &p, &q);
            ad__pool_row_pairs(r1 + 2 * ox, lo, hi, &u, &v);
            /* ad__max_2x2's choices: the first maximal cell of p q / u v */
            right_top = _mm512_cmp_ps_mask(q, p, _CMP_GT_OQ);
            right_bottom = _mm512_cmp_ps_mask(v, u, _CMP_GT_OQ);
            top = _mm512_mask_blend_ps(right_top, p, q);
            bottom = _mm512_mask_blend_ps(right_bottom, u, v);
            below = _mm512_cmp_ps_mask(bottom, top, _CMP_GT_OQ);
            sum = _mm512_add_ps(_mm512_add_ps(p, q), _mm512_add_ps(u, v));
            nan |= (_mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q) & out) != 0;
            _mm512_mask_storeu_ps(m + ox, out, _mm512_mask_blend_ps(below, top, bottom));
            if (!a) continue;
            at_top = _mm512_maskz_mov_epi32(right_top, one);
            at_bottom = _mm512_add_epi32(_mm512_set1_epi32(w), _mm512_maskz_mov_epi32(right_bottom, one));
            _mm512_mask_storeu_epi32(a + ox, out, _mm512_add_epi32(ad__pool_block_cells(oy * w + ox),
                                                                   _mm512_mask_blend_epi32(below, at_top, at_bottom)));
        }
        if (nan) ad__max_pool_row_nan(G, x, oy, m, a);
    }
}
#endif

/* A 2x2 plane at AVX-512's width where the processor has it (float builds); 0 when it was not
   done there. */
AD__INLINE int ad__max_pool_plane_2x2_wide(const ad__win2d *G, const ad_real *x, ad_real *y, int *arg)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    if (ad__isa() == AD__ISA_AVX512) {
        ad__max_pool_plane_2x2_avx512(G, x, y, arg);
        return 1;
    }
#endif
    (void)G;
    (void)x;
    (void)y;
    (void)arg;
    return 0;
}

typedef struct ad__max_pool_job {
    const ad__win2d *G;
    const int *range;
    const ad_real *x;
    ad_real *y;
    int *arg;
} ad__max_pool_job;

/* Planes [lo, hi) of a max pooling. */
AD__PRIVATE void ad__max_pool_planes(const void *ctx, size_t lo, size_t hi)
{
    const ad__max_pool_job *j = (const ad__max_pool_job *)ctx;
    const ad__win2d *G = j->G;
    size_t HW = (size_t)G->h * G->w, L = (size_t)G->oh * G->ow, p;
    int two_by_two = ad__pool_2x2(G);
    for (p = lo; p < hi; p++) {
        int *arg = j->arg ? j->arg + p * L : NULL;
        if (two_by_two) {
            if (!ad__max_pool_plane_2x2_wide(G, j->x + p * HW, j->y + p * L, arg))
                ad__max_pool_plane_2x2(G, j->x + p * HW, j->y + p * L, arg);
        } else {
            ad__max_pool_plane(G, j->range, j->x + p * HW, j->y + p * L, arg);
        }
    }
}

AUTODIFF_API ad_tensor *ad_max_pool2d(ad_tape *T, ad_tensor *x, int kernel_h, int kernel_w,
                                      const ad_pool2d_desc *desc)
{
    ad__win2d G;
    int shape[4], kj, *arg, *range;
    size_t P, HW, L;
    ad_tensor *y;
    ad__node *node;
    ad__max_pool_job job;
    if (!T || !x) return NULL;
    if (!ad__pool_geom(T, "ad_max_pool2d", x, kernel_h, kernel_w, desc, &G)) return NULL;
    shape[0] = G.n; shape[1] = G.c; shape[2] = G.oh; shape[3] = G.ow;
    y = ad__tensor(T, "ad_max_pool2d", 4, shape, 1);
    if (!y) return NULL;
    HW = (size_t)G.h * G.w;
    L = (size_t)G.oh * G.ow;
    P = (size_t)G.n * G.c;
    /* the winners' positions, kept for the backward gather / scatter pair */
    arg = NULL;
    if (T->grad_enabled && x->requires_grad) {
        arg = (int *)ad__alloc(T, y->size * sizeof(int), "ad_max_pool2d");
        if (!arg) return NULL;
    }
    range = (int *)ad__alloc(T, 2 * (size_t)G.kw * sizeof(int), "ad_max_pool2d");
    if (!range) return NULL;
    for (kj = 0; kj < G.kw; kj++) ad__win_range(kj - G.pw, G.sw, G.w, G.ow, &range[2 * kj], &range[2 * kj + 1]);
    job.G = &G;
    job.range = range;
    job.x = x->data;
    job.y = y->data;
    job.arg = arg;
    /* planes split over the tape's threads from AD__SPLIT_HEAVY values of x */
    ad__parallel_items(T, ad__max_pool_planes, &job, P, HW, ad__plane_block(L));
    node = ad__record1(T, "ad_max_pool2d", y, ad__gather_backward, x);
    if (!node) return NULL;
    node->st.gather.rows = (int)HW;
    node->st.gather.row_len = 1;
    node->st.gather.kind = AD__GATHER_MAX_POOL;
    node->st.gather.tiles = ad__pool_2x2(&G);
    node->st.gather.index = arg;
    return y;
}

#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
/* The gradient of one plane of a 2x2 max pooling with stride 2 (x [h, w] to [oh, ow]) into a new
   buffer d: every cell written once, g at its window's winner (arg, as the forward keeps it) and
   0 elsewhere, sixteen windows at a time with AVX-512. The same values as clearing d and adding
   g at the winners (0 + g, so a -0 arrives as +0). */
AD__PRIVATE __attribute__((target("avx512f"))) void
ad__max_pool_plane_2x2_adjoint_avx512(int h, int w, int oh, int ow, const float *AD__RESTRICT g,
                                      const int *AD__RESTRICT arg, float *AD__RESTRICT d)
{
    const __m512i right = _mm512_set1_epi32(1), below = _mm512_set1_epi32(w);
    const __m512i below_right = _mm512_set1_epi32(w + 1);
    int oy, ox, row;
    for (oy = 0; oy < oh; oy++) {
        float *r0 = d + (size_t)(2 * oy) * w, *r1 = r0 + w;
        for (ox = 0; ox < ow; ox += 16) {
            __mmask16 out, lo, hi;
            __m512 gv;
            __m512i at;
            ad__pool_block_masks(ow - ox < 16 ? ow - ox : 16, &out, &lo, &hi);
            gv = _mm512_add_ps(_mm512_setzero_ps(), _mm512_maskz_loadu_ps(out, g + (size_t)oy * ow + ox));
            /* the winner's place in its window: 0, 1, w or w + 1 */
            at = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(out, arg + (size_t)oy * ow + ox),
                                  ad__pool_block_cells(oy * w + ox));
            ad__pool_row_store_pairs(r0 + 2 * ox, lo, hi,
                                     _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, _mm512_setzero_si512()), gv),
                                     _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, right), gv));
            ad__pool_row_store_pairs(r1 + 2 * ox, lo, hi, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, below), gv),
                                     _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, below_right), gv));
        }
        if (w > 2 * ow) r0[w - 1] = r1[w - 1] = 0; /* an odd last column, in no window */
    }
    for (row = 2 * oh; row < h; row++) memset(d + (size_t)row * w, 0, (size_t)w * sizeof(float));
}

typedef struct ad__max_pool_adjoint_job {
    const float *g;
    const int *arg;
    float *d;
    int h, w, oh, ow;
} ad__max_pool_adjoint_job;

AD__PRIVATE void ad__max_pool_adjoint_planes(const void *ctx, size_t lo, size_t hi)
{
    const ad__max_pool_adjoint_job *j = (const ad__max_pool_adjoint_job *)ctx;
    size_t HW = (size_t)j->h * j->w, L = (size_t)j->oh * j->ow, p;
    for (p = lo; p < hi; p++)
        ad__max_pool_plane_2x2_adjoint_avx512(j->h, j->w, j->oh, j->ow, j->g + p * L, j->arg + p * L, j->d + p * HW);
}
#endif

/* The gradient of a 2x2 max pooling with stride 2 and no padding of x [n, c, h, w], from g (its
   output's gradient) and arg (the winners), into d, a new buffer of x's size, each cell written
   once where the processor has AVX-512 (float builds); 0 when it was not done here (then the
   scatter clears d and adds g at the winners, two passes over x's size). */
AD__PRIVATE int ad__max_pool_2x2_adjoint(ad_tape *T, const ad_tensor *g, const int *arg, const ad_tensor *x,
                                         ad_real *d)
{
#if AD__X86_DISPATCH && !defined(AUTODIFF_DOUBLE)
    ad__max_pool_adjoint_job job;
    size_t P = (size_t)x->shape[0] * (size_t)x->shape[1], HW;
    if (ad__isa() != AD__ISA_AVX512) return 0;
    job.g = g->data;
    job.arg = arg;
    job.d = d;
    job.h = x->shape[2];
    job.w = x->shape[3];
    job.oh = g->shape[2];
    job.ow = g->shape[3];
    HW = (size_t)job.h * job.w;
    ad__parallel_items(T, ad__max_pool_adjoint_planes, &job, P, HW, ad__plane_block(HW));
    return 1;
#else
    (void)T;
    (void)g;
    (void)arg;
    (void)x;
    (void)d;
    return 0;
#endif
}

/* Average pooling A x and its adjoint A^T g, one op: each is linear, and the gradient of
   either is the other. The entry keeps the kind. */
enum ad__avg_kind { AD__AVG_FORWARD, AD__AVG_ADJOINT };

AD__PRIVATE ad_tensor *ad__avg_pool_op(ad_tape *T, int kind, ad_tensor *a, const ad__win2d *G);

typedef struct ad__avg_pool_job {
    const ad__win2d *G;
    int kind, add;
    const ad_real *a;
    ad_real *out;
} ad__avg_pool_job;

/* Planes [lo, hi) of ad__avg_pool_kernel. */
AD__PRIVATE void ad__avg_pool_planes(const void *ctx, size_t lo, size_t hi)
{
    const ad__avg_pool_job *j = (const ad__avg_pool_job *)ctx;
    const ad__win2d *G = j->G;
    const ad_real *a = j->a;
    ad_real *out = j->out;
    int oy, ox, iy, ix, kind = j->kind, add = j->add;
    size_t p, HW = (size_t)G->h * G->w, L = (size_t)G->oh * G->ow;
    ad_real full = (ad_real)G->kh * (ad_real)G->kw;
    if (kind == AD__AVG_ADJOINT && !add) memset(out + lo * HW, 0, (hi - lo) * HW * sizeof(ad_real));
    for (p = lo; p < hi; p++)
        for (oy = 0; oy < G->oh; oy++) {
            int ys = oy * G->sh - G->ph, y0 = ys < 0 ? 0 : ys, y1 = ys + G->kh < G->h ? ys + G->kh : G->h;
            for (ox = 0; ox < G->ow; ox++) {
                int xs = ox * G->sw - G->pw, x0 = xs < 0 ? 0 : xs, x1 = xs + G->kw < G->w ? xs + G->kw : G->w;
                ad_real div = G->exclude_pad ? (ad_real)((y1 - y0) * (x1 - x0)) : full;
                size_t o = p * L + (size_t)(oy * G->ow + ox);
                if (kind == AD__AVG_FORWARD) {
                    const ad_real *src = a + p * HW;
                    ad_real s = 0;
                    for (iy = y0; iy < y1; iy++)
                        for (ix = x0; ix < x1; ix++) s += src[iy * G->w + ix];
                    out[o] = add ? out[o] + s / div : s / div;
                } else {
                    ad_real *dst = out + p * HW, share = a[o] / div;
                    for (iy = y0; iy < y1; iy++)
                        for (ix = x0; ix < x1; ix++) dst[iy * G->w + ix] += share;
                }
            }
        }
}

/* out (+)= A a (forward) or A^T a (adjoint), added into out when add is set; the planes split
   over T's threads from AD__SPLIT_HEAVY values of the pooling's input, as for max pooling. */
AD__PRIVATE void ad__avg_pool_kernel(ad_tape *T, const ad__win2d *G, int kind, const ad_real *a, ad_real *out,
                                     int add)
{
    ad__avg_pool_job job;
    size_t HW = (size_t)G->h * G->w, L = (size_t)G->oh * G->ow;
    job.G = G;
    job.kind = kind;
    job.add = add;
    job.a = a;
    job.out = out;
    ad__parallel_items(T, ad__avg_pool_planes, &job, (size_t)G->n * G->c, HW,
                       ad__plane_block(kind == AD__AVG_FORWARD ? L : HW));
}

AD__PRIVATE void ad__avg_pool_backward(ad__sweep *S, ad__node *n, ad_tensor *v)
{
    ad_real *d;
    int add;
    if (!ad__wants(S, n->in[0])) return;
    if (!S->create_graph) {
        if ((d = ad__grad_target(S, n->in[0], &add)) != NULL)
            ad__avg_pool_kernel(S->T, ad__win_of(n), 1 - n->st.avg_pool.kind, v->data, d, add);
        return;
    }
    ad__accum(S, n->in[0], ad__avg_pool_op(S->T, 1 - n->st.avg_pool.kind, v, ad__win_of(n)), 1);
}

AD__PRIVATE ad_tensor *ad__avg_pool_op(ad_tape *T, int kind, ad_tensor *a, const ad__win2d *G)
{
    const char *op = kind == AD__AVG_FORWARD ? "ad_avg_pool2d" : "ad_avg_pool2d (gradient)";
    int shape[4];
    ad_tensor *y;
    ad__node *node;
    if (!a) return NULL;
    shape[0] = G->n; shape[1] = G->c;
    shape[2] = kind == AD__AVG_FORWARD ? G->oh : G->h;
    shape[3] = kind == AD__AVG_FORWARD ? G->ow : G->w;
    y = ad__tensor(T, op, 4, shape, 1);
    if (!y) return NULL;
    ad__avg_pool_kernel(T, G, kind, a->data, y->data, 0);
    node = ad__record1(T, op, y, ad__avg_pool_backward, a);
    if (!node) return NULL;
    node->st.avg_pool.kind = kind;
    if (!ad__win_save(T, node, G, op)) return NULL;
    return y;
}

AUTODIFF_API ad_tensor *ad_avg_pool2d(ad_tape *T, ad_tensor *x, int kernel_h, int kernel_w,
                                      const ad_pool2d_desc *desc)
{
    ad__win2d G;
    if (!T || !x) return NULL;
    if (!ad__pool_geom(T, "ad_avg_pool2d", x, kernel_h, kernel_w, desc, &G)) return NULL;
    return ad__avg_pool_op(T, AD__AVG_FORWARD, x, &G);
}

AUTODIFF_API ad_tensor *ad_global_avg_pool2d(ad_tape *T, ad_tensor *x)
{
    int shape[3];
    char s[96];
    if (!T || !x) return NULL;
    if (!ad__on_tape(T, "ad_global_avg_pool2d", "the input", x)) return NULL;
    if (x->ndim != 4) {
        ad__fail(T, "ad_global_avg_pool2d: x %s must be [N, C, H, W]", ad_shape_str(x, s, sizeof s));
        return NULL;
    }
    shape[0] = x->shape[0];
    shape[1] = x->shape[1];
    shape[2] = x->shape[2] * x->shape[3];
    return ad_mean_axis(T, ad_reshape(T, x, 3, shape), 2, 0);
}

/* >>ops:dropout ------------------------------------------------------------------------------ */
AUTODIFF_API ad_tensor *ad_dropout(ad_tape *T, ad_tensor *x, ad_real p, ad_rng *rng)
{
    ad_tensor *mask;
    ad_real keep;
    size_t i;
    if (!T || !x) return NULL;
    if (!ad__on_tape(T, "ad_dropout", "the input", x)) return NULL;
    if (!(p >= 0 && p <= 1)) {
        ad__fail(T, "ad_dropout: p = %g must be in [0, 1]", (double)p);
        return NULL;
    }
    if (!T->training || p == 0) return x;
    if (!rng) { ad__fail(T, "ad_dropout: rng is NULL in training mode"); return NULL; }
    mask = ad__like(T, "ad_dropout", x);
    if (!mask) return NULL;
    keep = p < 1 ? 1 / (1 - p) : 0;
    for (i = 0; i < mask->size; i++) mask->data[i] = ad_rng_uniform(rng) < (double)p ? 0 : keep;
    return ad_mul(T, x, mask);
}

/* >>ops:norm --------------------------------------------------------------------------------- */
AUTODIFF_API int ad_batch_norm_init(ad_batch_norm_state *bn, int num_features, ad_real *running_mean,
                                    ad_real *running_var, char *err, size_t errlen)
{
    int i;
    if (!bn) return ad__fail_into(err, errlen, "ad_batch_norm_init: bn is NULL");
    memset(bn, 0, sizeof *bn);
    if (num_features < 1)
        return ad__fail_into(err, errlen, "ad_batch_norm_init: %d features; there must be at least 1", num_features);
    if ((!running_mean) != (!running_var))
        return ad__fail_into(err, errlen, "ad_batch_norm_init: only running_%s is given; give both buffers or "
                             "neither", running_mean ? "mean" : "var");
    if (!running_mean) {
        if ((size_t)num_features > (size_t)-1 / (2 * sizeof(ad_real)) ||
            !(running_mean = (ad_real *)AUTODIFF_MALLOC(2 * (size_t)num_features * sizeof(ad_real))))
            return ad__fail_into(err, errlen, "ad_batch_norm_init: out of memory for %d features", num_features);
        running_var = running_mean + num_features;
        bn->owns_buffers = 1;
    }
    for (i = 0; i < num_features; i++) {
        running_mean[i] = 0;
        running_var[i] = 1;
    }
    bn->num_features = num_features;
    bn->running_mean = running_mean;
    bn->running_var = running_var;
    bn->momentum = (ad_real)0.1;
    bn->eps = (ad_real)1e-5;
    return 0;
}

AUTODIFF_API void ad_batch_norm_free(ad_batch_norm_state *bn)
{
    if (!bn) return;
    if (bn->owns_buffers) AUTODIFF_FREE(bn->running_mean);
    memset(bn, 0, sizeof *bn);
}

/* Written with ops on x viewed as [N, C, H*W] (H*W = 1 for 2-D input), so every derivative,
   of any order, comes from the ops' own. */
AUTODIFF_API ad_tensor *ad_batch_norm(ad_tape *T, ad_tensor *x, ad_batch_norm_state *bn,
                                      ad_tensor *gamma, ad_tensor *beta)
{
    int shape3[3], cshape[3], i, c;
    size_t count;
    ad_tensor *x3, *y;
    char sx[96], sp[96];
    if (!T || !x) return NULL;
    if (!ad__on_tape(T, "ad_batch_norm", "x", x) || (gamma && !ad__on_tape(T, "ad_batch_norm", "gamma", gamma)) ||
        (beta && !ad__on_tape(T, "ad_batch_norm", "beta", beta)))
        return NULL;
    ad_shape_str(x, sx, sizeof sx);
    if (x->ndim != 2 && x->ndim != 4) {
        ad__fail(T, "ad_batch_norm: x %s must be [N, C] or [N, C, H, W]", sx);
        return NULL;
    }
    if (!bn || !bn->running_mean || !bn->running_var || bn->num_features < 1) {
        ad__fail(T, "ad_batch_norm: x %s: the state is not initialised (ad_batch_norm_init)", sx);
        return NULL;
    }
    c = x->shape[1];
    if (c != bn->num_features) {
        ad__fail(T, "ad_batch_norm: x %s has %d channels; the state has %d features", sx, c, bn->num_features);
        return NULL;
    }
    if (!(bn->eps >= 0) || !(bn->momentum >= 0 && bn->momentum <= 1)) {
        ad__fail(T, "ad_batch_norm: x %s: eps %g and momentum %g; eps must be >= 0 and momentum in [0, 1]", sx,
                 (double)bn->eps, (double)bn->momentum);
        return NULL;
    }
    for (i = 0; i < 2; i++) {
        ad_tensor *t = i ? beta : gamma;
        if (t && !(t->ndim == 1 && t->shape[0] == c)) {
            ad__fail(T, "ad_batch_norm: x %s, %s %s: it must be [%d]", sx, i ? "beta" : "gamma",
                     ad_shape_str(t, sp, sizeof sp), c);
            return NULL;
        }
    }
    shape3[0] = x->shape[0];
    shape3[1] = c;
    shape3[2] = (int)(x->size / ((size_t)x->shape[0] * (size_t)c));
    cshape[0] = 1;
    cshape[1] = c;
    cshape[2] = 1;
    count = (size_t)shape3[0] * (size_t)shape3[2];
    x3 = ad_reshape(T, x, 3, shape3);
    if (T->training) {
        ad_tensor *mean, *xc, *var;
        ad_real m = bn->momentum;
        double unbias;
        if (count < 2) {
            ad__fail(T, "ad_batch_norm: x %s: training needs more than one value per channel", sx);
            return NULL;
        }
        mean = ad_mean_axis(T, ad_mean_axis(T, x3, 2, 1), 0, 1);
        xc = ad_sub(T, x3, mean);
        var = ad_mean_axis(T, ad_mean_axis(T, ad_square(T, xc), 2, 1), 0, 1);
        y = ad_mul(T, xc, ad_pow(T, ad_add_scalar(T, var, bn->eps), (ad_real)-0.5));
        if (!y) return NULL;
        unbias = (double)count / (double)(count - 1);
        for (i = 0; i < c; i++) {
            bn->running_mean[i] = (1 - m) * bn->running_mean[i] + m * mean->data[i];
            bn->running_var[i] = (ad_real)((1 - m) * bn->running_var[i] + m * (double)var->data[i] * unbias);
        }
    } else {
        ad_tensor *mean = ad__tensor(T, "ad_batch_norm", 3, cshape, 1);
        ad_tensor *inv = ad__tensor(T, "ad_batch_norm", 3, cshape, 1);
        if (!mean || !inv) return NULL;
        for (i = 0; i < c; i++) {
            mean->data[i] = bn->running_mean[i];
            inv->data[i] = 1 / AD__F(sqrt)(bn->running_var[i] + bn->eps);
        }
        y = ad_mul(T, ad_sub(T, x3, mean), inv);
    }
    if (gamma) y = ad_mul(T, y, ad_reshape(T, gamma, 3, cshape));
    if (beta) y = ad_add(T, y, ad_reshape(T, beta, 3, cshape));
    return ad_reshape(T, y, x->ndim, x->shape);
}

/* Layer norm is one tape entry. The forward keeps the mean and 1 / sqrt(var + eps) of each row;
   a plain backward sweep gives, with xhat = (x - mean) rstd and
   h = g gamma,
       dx = rstd (h - mean(h) - xhat mean(h xhat)),   dgamma = sum over rows of g xhat,
       dbeta = sum over rows of g,
   in one pass over the rows, which go to the threads in blocks of AD__NORM_ROWS; each block sums
   its rows' share of dgamma and dbeta, and the blocks' sums are added in their order, so the
   bits do not depend on the thread count. A create_graph sweep writes the same derivative with
   the library's ops (ad__norm_recorded), so it can be differentiated again. */
typedef struct ad__norm_job {
    const ad_real *x, *gamma, *beta, *g;
    ad_real *y, *stats, *dx, *part; /* part: per block of rows, its dgamma, then its dbeta */
    size_t inner;
    ad_real eps;
    int add_x;
} ad__norm_job;

/* Sums of a row kept in AD__NORM_LANES running sums, one per lane, so that the compiler can
   keep them in vector registers (C fixes the order of a single running sum); the lanes are
   then added in order in double. */
enum { AD__NORM_LANES = 16 };

AD__HOT double ad__norm_lanes_total(const ad_real *lane)
{
    double total = 0;
    int l;
    for (l = 0; l < AD__NORM_LANES; l++) total += lane[l];
    return total;
}

/* The mean of one row of n values and 1 / sqrt(var + eps), from the two sums x and
   (x - mean)^2 */
AD__HOT void ad__norm_row_moments(const ad_real *AD__RESTRICT x, size_t n, ad_real *mean, ad_real *rstd,
                                  ad_real eps)
{
    ad_real lane[AD__NORM_LANES] = {0}, m;
    size_t i, l;
    double squares;
    for (i = 0; i + AD__NORM_LANES <= n; i += AD__NORM_LANES)
        for (l = 0; l < AD__NORM_LANES; l++) lane[l] += x[i + l];
    for (l = 0; i < n; i++, l++) lane[l] += x[i];
    m = (ad_real)(ad__norm_lanes_total(lane) / (double)n);
    memset(lane, 0, sizeof lane);
    for (i = 0; i + AD__NORM_LANES <= n; i += AD__NORM_LANES)
        for (l = 0; l < AD__NORM_LANES; l++) lane[l] += (x[i + l] - m) * (x[i + l] - m);
    for (l = 0; i < n; i++, l++) lane[l] += (x[i] - m) * (x[i] - m);
    squares = ad__norm_lanes_total(lane);
    *mean = m;
    *rstd = (ad_real)(1 / sqrt(squares / (double)n + (double)eps));
}

/* Rows [lo, hi) of y, and their mean and 1 / sqrt(var + eps) in stats. */
AD__HOT void ad__norm_forward_rows(const ad__norm_job *j, size_t lo, size_t hi)
{
    size_t r, i, n = j->inner;
    for (r = lo; r < hi; r++) {
        const ad_real *AD__RESTRICT x = j->x + r * n;
        ad_real *AD__RESTRICT y = j->y + r * n, mean, rstd;
        ad__norm_row_moments(x, n, &mean, &rstd, j->eps);
        j->stats[2 * r] = mean;
        j->stats[2 * r + 1] = rstd;
        for (i = 0; i < n; i++) y[i] = (x[i] - mean) * rstd;
        if (j->gamma)
            for (i = 0; i < n; i++) y[i] *= j->gamma[i];
        if (j->beta)
            for (i = 0; i < n; i++) y[i] += j->beta[i];
    }
}

/* One row of x's gradient, dx (+)= rstd (h - a - (x - mean) rstd c) with h = g gamma (g without
   gamma), a and c the row's means of h and of h (x - mean) rstd. Each case has a loop of its
   own, which the compiler vectorises; one loop with the conditions inside stays scalar. */
AD__HOT void ad__norm_dx_row(ad_real *AD__RESTRICT dx, const ad_real *AD__RESTRICT x, const ad_real *AD__RESTRICT g,
                             const ad_real *AD__RESTRICT gamma, size_t n, ad_real mean, ad_real rstd, ad_real a,
                             ad_real c, int add)
{
    size_t i;
#define AD__NORM_DX(H) (rstd * ((H) - a - (x[i] - mean) * rstd * c))
    if (gamma && add)
        for (i = 0; i < n; i++) dx[i] += AD__NORM_DX(g[i] * gamma[i]);
    else if (gamma)
        for (i = 0; i < n; i++) dx[i] = AD__NORM_DX(g[i] * gamma[i]);
    else if (add)
        for (i = 0; i < n; i++) dx[i] += AD__NORM_DX(g[i]);
    else
        for (i = 0; i < n; i++) dx[i] = AD__NORM_DX(g[i]);
#undef AD__NORM_DX
}

/* Rows [lo, hi), whole blocks of AD__NORM_ROWS but for the last: dx (when wanted) and each
   block's sums for dgamma and dbeta (when part is set). */
AD__HOT void ad__norm_backward_rows(const ad__norm_job *j, size_t lo, size_t hi)
{
    size_t r, i, l, n = j->inner;
    for (r = lo; r < hi; r++) {
        const ad_real *AD__RESTRICT x = j->x + r * n, *AD__RESTRICT g = j->g + r * n;
        const ad_real mean = j->stats[2 * r], rstd = j->stats[2 * r + 1];
        ad_real *dgamma = j->part ? j->part + r / AD__NORM_ROWS * 2 * n : NULL;
        ad_real *dbeta = dgamma ? dgamma + n : NULL;
        ad_real lane_h[AD__NORM_LANES] = {0}, lane_hx[AD__NORM_LANES] = {0}, a, c;
        if (dgamma) {
            if (r % AD__NORM_ROWS == 0) memset(dgamma, 0, 2 * n * sizeof(ad_real));
            for (i = 0; i < n; i++) {
                dgamma[i] += g[i] * ((x[i] - mean) * rstd);
                dbeta[i] += g[i];
            }
        }
        if (!j->dx) continue;
        if (j->gamma) {
            const ad_real *AD__RESTRICT gamma = j->gamma;
            for (i = 0; i + AD__NORM_LANES <= n; i += AD__NORM_LANES)
                for (l = 0; l < AD__NORM_LANES; l++) {
                    ad_real h = g[i + l] * gamma[i + l];
                    lane_h[l] += h;
                    lane_hx[l] += h * ((x[i + l] - mean) * rstd);
                }
            for (l = 0; i < n; i++, l++) {
                ad_real h = g[i] * gamma[i];
                lane_h[l] += h;
                lane_hx[l] += h * ((x[i] - mean) * rstd);
            }
        } else {
            for (i = 0; i + AD__NORM_LANES <= n; i += AD__NORM_LANES)
                for (l = 0; l < AD__NORM_LANES; l++) {
                    lane_h[l] += g[i + l];
                    lane_hx[l] += g[i + l] * ((x[i + l] - mean) * rstd);
                }
            for (l = 0; i < n; i++, l++) {
                lane_h[l] += g[i];
                lane_hx[l] += g[i] * ((x[i] - mean) * rstd);
            }
        }
        a = (ad_real)(ad__norm_lanes_total(lane_h) / (double)n);
        c = (ad_real)(ad__norm_lanes_total(lane_hx) / (double)n);
        ad__norm_dx_row(j->dx + r * n, x, g, j->gamma, n, mean, rstd, a, c, j->add_x);
    }
}

AD__PRIVATE void ad__norm_forward_range(const void *ctx, size_t lo, size_t hi)
{
    ad__norm_forward_rows((const ad__norm_job *)ctx, lo, hi);
}

AD__PRIVATE void ad__norm_backward_range(const void *ctx, size_t lo, size_t hi)
{
    ad__norm_backward_rows((const ad__norm_job *)ctx, lo, hi);
}

#if AD__X86_DISPATCH
/* The same loops at AVX2's width. Without FMA, which would round some products and sums once
   instead of twice, they give the portable loops' bits (the lanes fix the order of the sums). */
static __attribute__((target("avx2"))) AD__UNUSED void ad__norm_forward_range_avx2(const void *ctx, size_t lo,
                                                                                 size_t hi)
{
    ad__norm_forward_rows((const ad__norm_job *)ctx, lo, hi);
}

static __attribute__((target("avx2"))) AD__UNUSED void ad__norm_backward_range_avx2(const void *ctx, size_t lo,
                                                                                  size_t hi)
{
    ad__norm_backward_rows((const ad__norm_job *)ctx, lo, hi);
}
#endif

/* The forward (backward 0) or backward rows' function for the machine's vectors. */
AD__INLINE ad__range_fn ad__norm_kernel(int backward)
{
#if AD__X86_DISPATCH
    if (ad__isa() >= AD__ISA_AVX2) return backward ? ad__norm_backward_range_avx2 : ad__norm_forward_range_avx2;
#endif
    return backward ? ad__norm_backward_range : ad__norm_forward_range;
}

/* The same derivative with recorded ops, for create_graph sweeps: x as [rows, inner]. */
AD__PRIVATE void ad__norm_recorded(ad__sweep *S, ad__node *node, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = node->in[0], *gamma = node->in[1], *beta = node->in[2], *x2, *g2, *xc, *rstd, *xhat, *h;
    int shape[2];
    shape[1] = (int)node->st.norm.inner;
    shape[0] = (int)(x->size / node->st.norm.inner);
    x2 = ad_reshape(T, x, 2, shape);
    g2 = ad_reshape(T, g, 2, shape);
    xc = ad_sub(T, x2, ad_mean_axis(T, x2, 1, 1));
    rstd = ad_pow(T, ad_add_scalar(T, ad_mean_axis(T, ad_square(T, xc), 1, 1), node->st.norm.eps), (ad_real)-0.5);
    xhat = ad_mul(T, xc, rstd);
    h = gamma ? ad_mul(T, g2, ad_reshape(T, gamma, 1, shape + 1)) : g2;
    if (ad__wants(S, x)) {
        ad_tensor *dx = ad_sub(T, ad_sub(T, h, ad_mean_axis(T, h, 1, 1)), ad_mul(T, xhat, ad_mean_axis(T, ad_mul(T, h, xhat), 1, 1)));
        ad__accum(S, x, ad_reshape(T, ad_mul(T, rstd, dx), x->ndim, x->shape), 1);
    }
    if (gamma && ad__wants(S, gamma))
        ad__accum(S, gamma, ad_reshape(T, ad_sum_axis(T, ad_mul(T, g2, xhat), 0, 0), gamma->ndim, gamma->shape), 1);
    if (beta && ad__wants(S, beta))
        ad__accum(S, beta, ad_reshape(T, ad_sum_axis(T, g2, 0, 0), beta->ndim, beta->shape), 1);
}

/* dgamma or dbeta (which: 0 or 1) as a tensor of the parameter's shape: the blocks' sums added
   in order. */
AD__PRIVATE ad_tensor *ad__norm_param_grad(ad_tape *T, const ad_tensor *param, const ad_real *part, size_t blocks,
                                           size_t n, int which)
{
    ad_tensor *d = ad__tensor(T, "ad_layer_norm", param->ndim, param->shape, 1);
    size_t b, i;
    if (!d) return NULL;
    memcpy(d->data, part + which * n, n * sizeof(ad_real));
    for (b = 1; b < blocks; b++)
        for (i = 0; i < n; i++) d->data[i] += part[b * 2 * n + which * n + i];
    return d;
}

AD__PRIVATE void ad__norm_backward(ad__sweep *S, ad__node *node, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = node->in[0], *gamma = node->in[1], *beta = node->in[2];
    size_t n = node->st.norm.inner, rows = x->size / n, blocks = (rows + AD__NORM_ROWS - 1) / AD__NORM_ROWS;
    int want_gamma = gamma && ad__wants(S, gamma), want_beta = beta && ad__wants(S, beta);
    ad__norm_job job;
    if (S->create_graph) {
        ad__norm_recorded(S, node, g);
        return;
    }
    memset(&job, 0, sizeof job);
    job.x = x->data;
    job.gamma = gamma ? gamma->data : NULL;
    job.g = g->data;
    job.stats = (ad_real *)node->st.norm.stats;
    job.inner = n;
    if ((ad__wants(S, x) && !(job.dx = ad__grad_target(S, x, &job.add_x))) ||
        ((want_gamma || want_beta) &&
         !(job.part = (ad_real *)ad__alloc(T, blocks * 2 * n * sizeof(ad_real), "ad_layer_norm")))) {
        S->failed = 1;
        return;
    }
    ad__parallel_range(T, ad__norm_kernel(1), &job, rows, (AD__SPLIT_HEAVY + n - 1) / n, AD__NORM_ROWS);
    if (want_gamma) ad__accum(S, gamma, ad__norm_param_grad(T, gamma, job.part, blocks, n, 0), 1);
    if (want_beta) ad__accum(S, beta, ad__norm_param_grad(T, beta, job.part, blocks, n, 1), 1);
}

AD__PRIVATE ad_tensor *ad__layer_norm_fused(ad_tape *T, ad_tensor *x, size_t inner, ad_tensor *gamma,
                                            ad_tensor *beta, ad_real eps)
{
    size_t rows = x->size / inner;
    ad_tensor *y = ad__tensor(T, "ad_layer_norm", x->ndim, x->shape, 1), *ins[3];
    ad_real *stats = (ad_real *)ad__alloc(T, 2 * rows * sizeof(ad_real), "ad_layer_norm");
    ad__norm_job job;
    ad__node *node;
    if (!y || !stats) return NULL;
    memset(&job, 0, sizeof job);
    job.x = x->data;
    job.gamma = gamma ? gamma->data : NULL;
    job.beta = beta ? beta->data : NULL;
    job.y = y->data;
    job.stats = stats;
    job.inner = inner;
    job.eps = eps;
    ad__parallel_range(T, ad__norm_kernel(0), &job, rows, (AD__SPLIT_HEAVY + inner - 1) / inner, 1);
    ins[0] = x;
    ins[1] = gamma;
    ins[2] = beta;
    node = ad__record(T, "ad_layer_norm", y, ad__norm_backward, ins, 3);
    if (!node) return NULL;
    node->st.norm.stats = stats;
    node->st.norm.inner = inner;
    node->st.norm.eps = eps;
    return y;
}

AUTODIFF_API ad_tensor *ad_layer_norm(ad_tape *T, ad_tensor *x, int k, ad_tensor *gamma, ad_tensor *beta,
                                      ad_real eps)
{
    int i, j;
    size_t inner = 1;
    char sx[96], sp[96];
    if (!T || !x) return NULL;
    if (!ad__on_tape(T, "ad_layer_norm", "x", x) || (gamma && !ad__on_tape(T, "ad_layer_norm", "gamma", gamma)) ||
        (beta && !ad__on_tape(T, "ad_layer_norm", "beta", beta)))
        return NULL;
    ad_shape_str(x, sx, sizeof sx);
    if (k < 1 || k > x->ndim) {
        ad__fail(T, "ad_layer_norm: x %s: k = %d must be between 1 and %d", sx, k, x->ndim);
        return NULL;
    }
    if (!(eps >= 0)) {
        ad__fail(T, "ad_layer_norm: x %s: eps %g must not be negative", sx, (double)eps);
        return NULL;
    }
    for (i = 0; i < 2; i++) {
        ad_tensor *t = i ? beta : gamma;
        int ok;
        if (!t) continue;
        ok = t->ndim == k;
        for (j = 0; ok && j < k; j++)
            if (t->shape[j] != x->shape[x->ndim - k + j]) ok = 0;
        if (!ok) {
            ad__fail(T, "ad_layer_norm: x %s, k = %d: %s %s must have x's last %d dimension(s)", sx, k,
                     i ? "beta" : "gamma", ad_shape_str(t, sp, sizeof sp), k);
            return NULL;
        }
    }
    for (i = x->ndim - k; i < x->ndim; i++) inner *= (size_t)x->shape[i];
    return ad__layer_norm_fused(T, x, inner, gamma, beta, eps);
}

/* >>ops:rnn ---------------------------------------------------------------------------------- */
/* ad_lstm_cell and ad_gru_cell. A cell is one tape entry: its two products on the GEMM (into
   one buffer for the LSTM, whose gates add them; into two for the GRU, whose n gate needs
   h w_hn^T + b_hn on its own), then one fused pass over each row of gates that applies the
   nonlinearities and updates the state, keeping the activated gates for the backward. A plain
   backward sweep runs one fused pass that gives the gradients of the gates' inputs and of the
   state, then the products' gradients on the GEMM (as ad_linear's), adding into the gradient
   buffers. A create_graph sweep rebuilds the cell from its inputs with recorded ops and writes
   the same derivative with them (ad__lstm_recorded, ad__gru_recorded), so it can be
   differentiated again.

   The LSTM cell has two results, h' and c', and a tape entry has one output. The cell's entry
   makes one [2, N, H] tensor, h' then c', and h' and c' are views of its halves (no copy),
   each with a small entry whose backward puts its gradient into its half of the cell's. The
   cell's backward then has both gradients side by side in one buffer (a half that nothing
   used reads as zeros) and the fused pass needs both at once: c's gradient is
   dc' + dh' o (1 - tanh^2 c'). Two entries sharing the gates, one per result, would have to
   split that pass in two, the h' entry's adding into the c' entry's gradient. */

/* The sigmoid or tanh of n values in place, with the vector functions where they exist (the
   same values ad_sigmoid and ad_tanh give). */
AD__PRIVATE void ad__rnn_sigmoid(ad_real *v, size_t n)
{
    size_t i;
    if (ad__unary_vectorised(AD__U_SIGMOID, v, v, n)) return;
    for (i = 0; i < n; i++) v[i] = ad__sigmoid1(v[i]);
}

AD__PRIVATE void ad__rnn_tanh(ad_real *v, size_t n)
{
    size_t i;
    if (ad__unary_vectorised(AD__U_TANH, v, v, n)) return;
    for (i = 0; i < n; i++) v[i] = AD__F(tanh)(v[i]);
}

/* The biases of a cell's entry (NULL where not given): its inputs from `first` on, those given
   only, as st.rnn.biases says. */
AD__PRIVATE void ad__rnn_biases(const ad__node *n, int first, ad_tensor **b_ih, ad_tensor **b_hh)
{
    int bits = n->st.rnn.biases;
    *b_ih = bits & 1 ? n->in[first] : NULL;
    *b_hh = bits & 2 ? n->in[first + (bits & 1)] : NULL;
}

/* Checks the inputs of a cell, or with seq set of a layer (x [L, N, I], h and c its initial
   state h0 and c0, either of which may then be NULL). gates: 4 for the LSTM, 3 for the GRU
   (c NULL). H is h's last dimension, or w_hh's where h is NULL. Records an error naming op and
   every shape and returns 0 when one is wrong. */
AD__PRIVATE int ad__rnn_check(ad_tape *T, const char *op, int seq, int gates, ad_tensor *x, ad_tensor *h,
                              ad_tensor *c, ad_tensor *w_ih, ad_tensor *w_hh, ad_tensor *b_ih, ad_tensor *b_hh)
{
    char why[96], s[7][48];
    const char *role[7] = {"x", "h", "c", "w_ih", "w_hh", "b_ih", "b_hh"};
    ad_tensor *t[7];
    int i, rows, in, hid;
    long long G; /* the weights' rows, gates * H, which need not fit an int when H is wrong */
    t[0] = x; t[1] = h; t[2] = c; t[3] = w_ih; t[4] = w_hh; t[5] = b_ih; t[6] = b_hh;
    if (seq) {
        role[1] = "h0";
        role[2] = "c0";
    }
    for (i = 0; i < 7; i++)
        if (t[i] && !ad__on_tape(T, op, role[i], t[i])) return 0;
    why[0] = 0;
    if (x->ndim != 2 + seq || (h && (h->ndim != 2 || x->shape[seq] != h->shape[0]))) {
        snprintf(why, sizeof why, "x must be [%sN, I]%s%s%s", seq ? "L, " : "", h ? " and " : "", h ? role[1] : "",
                 h ? " [N, H]" : "");
    } else if (!h && w_hh->ndim != 2) {
        snprintf(why, sizeof why, "w_hh must be [%dH, H]", gates);
    } else {
        rows = x->shape[seq];
        in = x->shape[seq + 1];
        hid = h ? h->shape[1] : w_hh->shape[1];
        G = (long long)gates * hid;
        if (c && !(c->ndim == 2 && c->shape[0] == rows && c->shape[1] == hid))
            snprintf(why, sizeof why, "%s must be [%d,%d]%s%s", role[2], rows, hid, h ? ", as " : "", h ? role[1] : "");
        else if (w_ih->ndim != 2 || w_ih->shape[0] != G || w_ih->shape[1] != in)
            snprintf(why, sizeof why, "w_ih must be [%lld,%d] (%dH, I)", G, in, gates);
        else if (w_hh->ndim != 2 || w_hh->shape[0] != G || w_hh->shape[1] != hid)
            snprintf(why, sizeof why, "w_hh must be [%lld,%d] (%dH, H)", G, hid, gates);
        else if ((b_ih && !(b_ih->ndim == 1 && b_ih->shape[0] == G)) ||
                 (b_hh && !(b_hh->ndim == 1 && b_hh->shape[0] == G)))
            snprintf(why, sizeof why, "b_ih and b_hh must be [%lld] (%dH)", G, gates);
    }
    if (!why[0]) return 1;
    for (i = 0; i < 7; i++)
        if (t[i]) ad_shape_str(t[i], s[i], sizeof s[i]);
        else snprintf(s[i], sizeof s[i], "none");
    if (gates == 4)
        ad__fail(T, "%s: x %s, %s %s, %s %s, w_ih %s, w_hh %s, b_ih %s, b_hh %s: %s", op, s[0], role[1], s[1], role[2],
                 s[2], s[3], s[4], s[5], s[6], why);
    else ad__fail(T, "%s: x %s, %s %s, w_ih %s, w_hh %s, b_ih %s, b_hh %s: %s", op, s[0], role[1], s[1], s[3], s[4],
                  s[5], s[6], why);
    return 0;
}

/* Every row of out [rows, G] set to b1 + b2 (either may be NULL; not both). */
AD__PRIVATE void ad__rnn_bias_rows(ad_real *out, size_t rows, int G, const ad_tensor *b1, const ad_tensor *b2)
{
    size_t r;
    int j;
    for (j = 0; j < G; j++) out[j] = (b1 ? b1->data[j] : 0) + (b2 ? b2->data[j] : 0);
    for (r = 1; r < rows; r++) memcpy(out + r * G, out, (size_t)G * sizeof(ad_real));
}

/* out [rows, G] = b1 + b2 (either or both may be NULL) + x w1^T (+ h w2^T when w2 is given), on
   the GEMM, with x [rows, I] and h [rows, H] contiguous; w1^T read from pk1 where it is not
   NULL (ad__gemm_prepack_bt). Returns 0, or -1 when the packing buffers cannot be allocated. */
AD__PRIVATE int ad__rnn_products(ad_tape *T, ad_real *out, int G, int rows, const ad_real *x, const ad_tensor *w1,
                                 const ad__packed_b *pk1, const ad_tensor *b1, const ad_real *h, const ad_tensor *w2,
                                 const ad_tensor *b2)
{
    int in = w1->shape[1], biased = b1 || b2;
    if (biased) ad__rnn_bias_rows(out, (size_t)rows, G, b1, b2);
    if (ad__gemm_packed(T, 0, 1, rows, G, in, x, in, w1->data, in, out, G, biased, pk1) != 0) return -1;
    if (w2 && ad__gemm(T, 0, 1, rows, G, w2->shape[1], h, w2->shape[1], w2->data, w2->shape[1], out, G, 1) != 0)
        return -1;
    return 0;
}

/* db (+)= the column sums of dg [rows, G], in row order (so any thread count gives the same
   sums), for sweeps that do not record. */
AD__PRIVATE void ad__rnn_bias_grad(ad__sweep *S, ad_tensor *b, const ad_real *dg, size_t rows)
{
    size_t G = b->size, r;
    int add;
    ad_real *d;
    if (!ad__wants(S, b)) return;
    if (!(d = ad__grad_target(S, b, &add))) {
        S->failed = 1;
        return;
    }
    if (!add) memset(d, 0, G * sizeof(ad_real));
    for (r = 0; r < rows; r++) ad__add_into(d, dg + r * G, G);
}

/* The same for two biases that receive the same gradient (an LSTM's b_ih and b_hh): the column
   sums taken once. */
AD__PRIVATE void ad__rnn_bias_pair_grad(ad__sweep *S, const char *op, ad_tensor *b1, ad_tensor *b2, const ad_real *dg,
                                        size_t rows)
{
    ad_tensor *b[2];
    ad_real *sums, *d;
    size_t G, r;
    int i, add;
    b[0] = b1 && ad__wants(S, b1) ? b1 : NULL;
    b[1] = b2 && ad__wants(S, b2) ? b2 : NULL;
    if (!b[0] || !b[1]) {
        if (b[0] || b[1]) ad__rnn_bias_grad(S, b[0] ? b[0] : b[1], dg, rows);
        return;
    }
    G = b1->size;
    if (!(sums = (ad_real *)ad__alloc(S->T, G * sizeof(ad_real), op))) {
        S->failed = 1;
        return;
    }
    memset(sums, 0, G * sizeof(ad_real));
    for (r = 0; r < rows; r++) ad__add_into(sums, dg + r * G, G);
    for (i = 0; i < 2; i++) {
        if (!(d = ad__grad_target(S, b[i], &add))) {
            S->failed = 1;
            return;
        }
        if (add) ad__add_into(d, sums, G);
        else memcpy(d, sums, G * sizeof(ad_real));
    }
}

/* The gradients through gates = x w^T + b given dg = d gates [rows, G], with x [..., in] of
   rows rows: dx (+)= dg w, dw (+)= dg^T x, db (+)= the column sums of dg, for sweeps that do
   not record. Each buffer is asked for just before it is written, so an input given twice (x
   also as h) adds its second share. */
AD__PRIVATE void ad__rnn_product_grads(ad__sweep *S, ad_tensor *x, ad_tensor *w, ad_tensor *b, const ad_real *dg)
{
    int in = w->shape[1], G = w->shape[0], rows = (int)(x->size / (size_t)in), add;
    ad_real *d;
    if (ad__wants(S, x) && (!(d = ad__grad_target(S, x, &add)) ||
                            ad__gemm(S->T, 0, 0, rows, in, G, dg, G, w->data, in, d, in, add) != 0))
        S->failed = 1;
    if (ad__wants(S, w) && (!(d = ad__grad_target(S, w, &add)) ||
                            ad__gemm(S->T, 1, 0, G, in, rows, dg, G, x->data, in, d, in, add) != 0))
        S->failed = 1;
    if (b) ad__rnn_bias_grad(S, b, dg, (size_t)rows);
}

/* The same with recorded ops, for sweeps that record. */
AD__PRIVATE void ad__rnn_product_grads_recorded(ad__sweep *S, ad_tensor *x, ad_tensor *w, ad_tensor *b,
                                                ad_tensor *dg)
{
    ad_tape *T = S->T;
    int flat[2];
    flat[0] = (int)(x->size / (size_t)w->shape[1]);
    flat[1] = w->shape[1];
    if (ad__wants(S, x)) ad__accum(S, x, ad_reshape(T, ad_matmul(T, dg, w), x->ndim, x->shape), 1);
    if (ad__wants(S, w)) ad__accum(S, w, ad_matmul_t(T, dg, ad_reshape(T, x, 2, flat), 1, 0), 1);
    if (b && ad__wants(S, b)) ad__accum(S, b, ad_sum_axis(T, dg, 0, 0), 1);
}

/* x w^T + b + h w2^T + b2 with recorded ops (w2 NULL: the first two terms only). */
AD__PRIVATE ad_tensor *ad__rnn_products_recorded(ad_tape *T, ad_tensor *x, ad_tensor *w, ad_tensor *b,
                                                 ad_tensor *h, ad_tensor *w2, ad_tensor *b2)
{
    ad_tensor *y = ad_matmul_t(T, x, w, 0, 1);
    if (b) y = ad_add(T, y, b);
    if (w2) y = ad_add(T, y, ad_matmul_t(T, h, w2, 0, 1));
    if (b2) y = ad_add(T, y, b2);
    return y;
}

/* s (1 - s): the derivative of a sigmoid from its value, recorded. */
AD__PRIVATE ad_tensor *ad__rnn_sigmoid_slope(ad_tape *T, ad_tensor *s)
{
    return ad_mul(T, s, ad_rsub_scalar(T, 1, s));
}

/* Columns [k H, (k + 1) H) of a [N, m H] tensor, recorded. */
AD__PRIVATE ad_tensor *ad__rnn_block(ad_tape *T, ad_tensor *a, int k, int H)
{
    return ad_slice(T, a, 1, k * H, (k + 1) * H);
}

/* The LSTM's rows [lo, hi): gates (their sum before, i f g o activated after), h' and c' into
   hn and cn, tanh(c') into tc. */
typedef struct ad__lstm_job {
    ad_real *gates, *tc;        /* [N, 4H] and [N, H] */
    ad_real *hn, *cn;           /* forward: h' and c' [N, H] */
    const ad_real *c;
    const ad_real *gh, *gc;     /* backward: dh' and dc' */
    ad_real *dgates, *dc;       /* backward: d gates, and c's gradient buffer (NULL: not wanted;
                                   it may be gc itself, with add clear) */
    int H, add;
} ad__lstm_job;

AD__PRIVATE void ad__lstm_forward_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__lstm_job *j = (const ad__lstm_job *)ctx;
    size_t r, H = (size_t)j->H, k;
    for (r = lo; r < hi; r++) {
        ad_real *gt = j->gates + r * 4 * H, *tc = j->tc + r * H, *hn = j->hn + r * H, *cn = j->cn + r * H;
        const ad_real *c = j->c + r * H;
        ad__rnn_sigmoid(gt, 2 * H);
        ad__rnn_tanh(gt + 2 * H, H);
        ad__rnn_sigmoid(gt + 3 * H, H);
        for (k = 0; k < H; k++) cn[k] = gt[H + k] * c[k] + gt[k] * gt[2 * H + k];
        memcpy(tc, cn, H * sizeof(ad_real));
        ad__rnn_tanh(tc, H);
        for (k = 0; k < H; k++) hn[k] = gt[3 * H + k] * tc[k];
    }
}

/* With t = tanh(c'): dct = dc' + dh' o (1 - t^2), d i = dct g i (1 - i), d f = dct c f (1 - f),
   d g = dct i (1 - g^2), d o = dh' t o (1 - o), and dc (+)= dct f. */
AD__PRIVATE void ad__lstm_backward_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__lstm_job *j = (const ad__lstm_job *)ctx;
    size_t r, H = (size_t)j->H, k;
    for (r = lo; r < hi; r++) {
        const ad_real *gt = j->gates + r * 4 * H, *tc = j->tc + r * H, *c = j->c + r * H;
        const ad_real *gh = j->gh + r * H, *gc = j->gc + r * H;
        ad_real *dg = j->dgates + r * 4 * H, *dc = j->dc ? j->dc + r * H : NULL;
        for (k = 0; k < H; k++) {
            ad_real i = gt[k], f = gt[H + k], g = gt[2 * H + k], o = gt[3 * H + k], t = tc[k];
            ad_real dct = gc[k] + gh[k] * o * (1 - t * t);
            dg[k] = dct * g * (i * (1 - i));
            dg[H + k] = dct * c[k] * (f * (1 - f));
            dg[2 * H + k] = dct * i * (1 - g * g);
            dg[3 * H + k] = gh[k] * t * (o * (1 - o));
            if (dc) dc[k] = (j->add ? dc[k] : 0) + dct * f;
        }
    }
}

/* One LSTM step rebuilt with recorded ops, for sweeps that record: the activated gates from
   their sum pre [N, 4H], the step's c, its c' and tanh(c'). */
typedef struct ad__lstm_rec {
    ad_tensor *i, *f, *g, *o, *c, *cn, *tc;
} ad__lstm_rec;

AD__PRIVATE void ad__lstm_rec_forward(ad_tape *T, ad_tensor *pre, ad_tensor *c, int H, ad__lstm_rec *s)
{
    s->i = ad_sigmoid(T, ad__rnn_block(T, pre, 0, H));
    s->f = ad_sigmoid(T, ad__rnn_block(T, pre, 1, H));
    s->g = ad_tanh(T, ad__rnn_block(T, pre, 2, H));
    s->o = ad_sigmoid(T, ad__rnn_block(T, pre, 3, H));
    s->c = c;
    s->cn = ad_add(T, ad_mul(T, s->f, c), ad_mul(T, s->i, s->g));
    s->tc = ad_tanh(T, s->cn);
}

/* The step's derivative with recorded ops (the formulas of ad__lstm_backward_range): d gates
   [N, 4H] from dh' (gh) and dc' (gc), and c's gradient dct f in *dc. NULL when an op failed. */
AD__PRIVATE ad_tensor *ad__lstm_rec_backward(ad_tape *T, const ad__lstm_rec *s, ad_tensor *gh, ad_tensor *gc,
                                             ad_tensor **dc)
{
    ad_tensor *dct, *parts[4];
    dct = ad_add(T, gc, ad_mul(T, gh, ad_mul(T, s->o, ad_rsub_scalar(T, 1, ad_square(T, s->tc)))));
    parts[0] = ad_mul(T, dct, ad_mul(T, s->g, ad__rnn_sigmoid_slope(T, s->i)));
    parts[1] = ad_mul(T, dct, ad_mul(T, s->c, ad__rnn_sigmoid_slope(T, s->f)));
    parts[2] = ad_mul(T, dct, ad_mul(T, s->i, ad_rsub_scalar(T, 1, ad_square(T, s->g))));
    parts[3] = ad_mul(T, gh, ad_mul(T, s->tc, ad__rnn_sigmoid_slope(T, s->o)));
    *dc = ad_mul(T, dct, s->f);
    return *dc ? ad_concat(T, parts, 4, 1) : NULL;
}

AD__PRIVATE void ad__lstm_recorded(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *h = n->in[1], *c = n->in[2], *w_ih = n->in[3], *w_hh = n->in[4], *b_ih, *b_hh;
    ad_tensor *gh, *gc, *dc, *dgates;
    ad__lstm_rec step;
    ad__rnn_biases(n, 5, &b_ih, &b_hh);
    ad__lstm_rec_forward(T, ad__rnn_products_recorded(T, x, w_ih, b_ih, h, w_hh, b_hh), c, h->shape[1], &step);
    gh = ad_reshape(T, ad_slice(T, g, 0, 0, 1), 2, h->shape);
    gc = ad_reshape(T, ad_slice(T, g, 0, 1, 2), 2, h->shape);
    if (!(dgates = ad__lstm_rec_backward(T, &step, gh, gc, &dc))) {
        S->failed = 1;
        return;
    }
    if (ad__wants(S, c)) ad__accum(S, c, dc, 1);
    ad__rnn_product_grads_recorded(S, x, w_ih, b_ih, dgates);
    ad__rnn_product_grads_recorded(S, h, w_hh, b_hh, dgates);
}

AD__PRIVATE void ad__lstm_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad__lstm_job job;
    ad_tensor *x = n->in[0], *h = n->in[1], *c = n->in[2], *b_ih, *b_hh;
    int rows = h->shape[0], H = h->shape[1];
    if (S->create_graph) {
        ad__lstm_recorded(S, n, g);
        return;
    }
    ad__rnn_biases(n, 5, &b_ih, &b_hh);
    job.gates = (ad_real *)n->st.rnn.gates;
    job.tc = (ad_real *)n->st.rnn.aux;
    job.hn = job.cn = NULL;
    job.c = c->data;
    job.gh = g->data;
    job.gc = g->data + (size_t)rows * H;
    job.H = H;
    job.add = 0;
    job.dc = NULL;
    job.dgates = (ad_real *)ad__alloc(S->T, (size_t)rows * 4 * H * sizeof(ad_real), "ad_lstm_cell");
    if (!job.dgates || (ad__wants(S, c) && !(job.dc = ad__grad_target(S, c, &job.add)))) {
        S->failed = 1;
        return;
    }
    ad__parallel_items(S->T, ad__lstm_backward_range, &job, (size_t)rows, (size_t)H * 4, 1);
    ad__rnn_product_grads(S, x, n->in[3], NULL, job.dgates);
    ad__rnn_product_grads(S, h, n->in[4], NULL, job.dgates);
    ad__rnn_bias_pair_grad(S, "ad_lstm_cell", b_ih, b_hh, job.dgates, (size_t)rows);
    if (S->failed && !S->T->has_error) ad__fail(S->T, "ad_lstm_cell: out of memory in the backward sweep");
}

/* A part of a recurrent op's result, rows [start, start + len) of its first axis, as a view
   (h' or c' of the LSTM cell's [2, N, H]; the outputs, h_n or c_n of the LSTM layer's
   [L + 1, N, H]; h_n of the GRU layer's [L, N, H]). Its gradient goes into that part of the
   result's, the rest zero until another part adds to it (parts may overlap: the LSTM layer's
   h_n is the last of its outputs). */
AD__PRIVATE void ad__rnn_part_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *y = n->in[0];
    int start = n->st.rnn_part.start, len = (int)(g->size / (y->size / (size_t)y->shape[0])), add;
    size_t before = g->size / (size_t)len * (size_t)start;
    ad_real *d;
    if (S->create_graph) {
        int shape[AD_MAX_DIMS];
        memcpy(shape, y->shape, sizeof shape);
        shape[0] = len;
        ad__accum(S, y, ad__pad_axis(S->T, ad_reshape(S->T, g, y->ndim, shape), 0, start, y->shape[0]), 1);
        return;
    }
    if (!(d = ad__grad_target(S, y, &add))) return;
    if (add) {
        ad__add_into(d + before, g->data, g->size);
    } else {
        memset(d, 0, before * sizeof(ad_real));
        memcpy(d + before, g->data, g->size * sizeof(ad_real));
        memset(d + before + g->size, 0, (y->size - before - g->size) * sizeof(ad_real));
    }
}

AD__PRIVATE ad_tensor *ad__rnn_part(ad_tape *T, const char *op, ad_tensor *y, int start, int ndim, const int *shape)
{
    ad_tensor *v = ad__tensor(T, op, ndim, shape, 0);
    ad__node *n;
    if (!v) return NULL;
    v->data = y->data + y->size / (size_t)y->shape[0] * (size_t)start;
    n = ad__record1(T, op, v, ad__rnn_part_backward, y);
    if (!n) return NULL;
    n->st.rnn_part.start = start;
    return v;
}

/* Records a cell's or a layer's entry: its inputs ins[0 .. count-1], then the biases given, and
   its state. */
AD__PRIVATE ad__node *ad__rnn_record(ad_tape *T, const char *op, ad_tensor *y, ad__backward_fn bw, ad_tensor **ins,
                                     int count, ad_tensor *b_ih, ad_tensor *b_hh, const ad_real *gates,
                                     const ad_real *aux)
{
    ad__node *n;
    if (b_ih) ins[count++] = b_ih;
    if (b_hh) ins[count++] = b_hh;
    n = ad__record(T, op, y, bw, ins, count);
    if (!n) return NULL;
    n->st.rnn.biases = (b_ih ? 1 : 0) | (b_hh ? 2 : 0);
    n->st.rnn.gates = gates;
    n->st.rnn.aux = aux;
    return n;
}

AUTODIFF_API ad_tensor *ad_lstm_cell(ad_tape *T, ad_tensor *x, ad_tensor *h, ad_tensor *c, ad_tensor *w_ih,
                                     ad_tensor *w_hh, ad_tensor *b_ih, ad_tensor *b_hh, ad_tensor **c_out)
{
    ad__lstm_job job;
    ad_tensor *y, *ins[7], *hn;
    int shape[3], rows, H;
    if (c_out) *c_out = NULL;
    if (!T || !x || !h || !c || !w_ih || !w_hh) return NULL;
    if (!ad__rnn_check(T, "ad_lstm_cell", 0, 4, x, h, c, w_ih, w_hh, b_ih, b_hh)) return NULL;
    if (!c_out) {
        ad__fail(T, "ad_lstm_cell: c_out is NULL; it receives c'");
        return NULL;
    }
    rows = h->shape[0];
    H = h->shape[1];
    shape[0] = 2;
    shape[1] = rows;
    shape[2] = H;
    y = ad__tensor(T, "ad_lstm_cell", 3, shape, 1);
    job.gates = (ad_real *)ad__alloc(T, (size_t)rows * 5 * H * sizeof(ad_real), "ad_lstm_cell");
    if (!y || !job.gates) return NULL;
    if (ad__rnn_products(T, job.gates, 4 * H, rows, x->data, w_ih, NULL, b_ih, h->data, w_hh, b_hh) != 0) {
        ad__fail(T, "ad_lstm_cell: out of memory for the packing buffer");
        return NULL;
    }
    job.tc = job.gates + (size_t)rows * 4 * H;
    job.hn = y->data;
    job.cn = y->data + (size_t)rows * H;
    job.c = c->data;
    job.H = H;
    ad__parallel_items(T, ad__lstm_forward_range, &job, (size_t)rows, (size_t)H * 5, 1);
    ins[0] = x;
    ins[1] = h;
    ins[2] = c;
    ins[3] = w_ih;
    ins[4] = w_hh;
    if (!ad__rnn_record(T, "ad_lstm_cell", y, ad__lstm_backward, ins, 5, b_ih, b_hh, job.gates, job.tc))
        return NULL;
    hn = ad__rnn_part(T, "ad_lstm_cell", y, 0, 2, y->shape + 1);
    *c_out = ad__rnn_part(T, "ad_lstm_cell", y, 1, 2, y->shape + 1);
    return *c_out ? hn : NULL;
}

/* ---- the LSTM layer: a whole sequence in one entry -------------------------------------------
   ad_lstm runs ad_lstm_cell's step over L time steps in one entry, whose result is [L + 1, N, H]:
   the h of every step, then the last c; the outputs, h_n and c_n are views of its parts
   (ad__rnn_part). The input projections of all steps are one product of L N rows, x w_ih^T,
   so only h w_hh^T remains a product of N rows per step; w_hh^T (and w_ih^T when the input
   products go in chunks) is packed once for all of the call's products (ad__rnn_prepack). The
   backward sweep goes back through the steps with the cell's fused pass and one product per
   step, dh = d gates w_hh, keeping every step's d gates; x's and w_ih's gradients are then one
   product each over the L N rows, and w_hh's two (ad__rnn_layer_w_hh_grad). The tape keeps
   every step's activated gates, tanh(c) and c. A call that is not recorded keeps none of them:
   the input projections then go AD__RNN_CHUNK_ROWS rows at a time (ad__rnn_chunk_steps) into
   one chunk's gates, and the steps share one tanh(c) and two c in turn. */

/* The layer's step: gates (their sum after the input projection) gain h w_hh^T (w_hh^T read
   from hh where packed) and are activated; h and c are written where the job says. */
AD__PRIVATE int ad__lstm_layer_step(ad_tape *T, ad__lstm_job *job, const ad_real *h, const ad_real *c,
                                    const ad_tensor *w_hh, const ad__packed_b *hh, int N)
{
    int H = job->H;
    if (ad__gemm_packed(T, 0, 1, N, 4 * H, H, h, H, w_hh->data, H, job->gates, 4 * H, 1, hh) != 0) return -1;
    job->c = c;
    ad__parallel_items(T, ad__lstm_forward_range, job, (size_t)N, (size_t)H * 5, 1);
    return 0;
}

/* w_hh's gradient in a layer of L steps of N rows: dg [L N, G] holds every step's gradient of
   h w_hh^T; step 0 read h0, step t > 0 the output y of step t - 1, so two products cover the
   sequence. Returns 0, or -1 when memory runs out. */
AD__PRIVATE int ad__rnn_layer_w_hh_grad(ad__sweep *S, ad_tensor *w_hh, const ad_real *dg, const ad_real *h0,
                                        const ad_real *y, int L, int N)
{
    int G = w_hh->shape[0], H = w_hh->shape[1], add;
    ad_real *d;
    if (!ad__wants(S, w_hh)) return 0;
    if (!(d = ad__grad_target(S, w_hh, &add)) || ad__gemm(S->T, 1, 0, G, H, N, dg, G, h0, H, d, H, add) != 0)
        return -1;
    if (L > 1 && ad__gemm(S->T, 1, 0, G, H, (L - 1) * N, dg + (size_t)N * G, G, y, H, d, H, 1) != 0) return -1;
    return 0;
}

/* The recorded derivative, for sweeps that record: the layer rebuilt step by step with recorded
   ops, then the cell's recorded derivative taken back through the steps. */
AD__PRIVATE void ad__lstm_layer_recorded(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *h0 = n->in[1], *c0 = n->in[2], *w_ih = n->in[3], *w_hh = n->in[4], *b_ih, *b_hh;
    ad_tensor *pre, **hs, **dgates, *gh, *gc, *dc = NULL, *dall, *hprev;
    ad__lstm_rec *steps;
    int L = x->shape[0], N = x->shape[1], H = h0->shape[1], t, flat[2];
    ad__rnn_biases(n, 5, &b_ih, &b_hh);
    steps = (ad__lstm_rec *)ad__alloc(T, (size_t)L * sizeof *steps, "ad_lstm");
    hs = (ad_tensor **)ad__alloc(T, (size_t)2 * L * sizeof *hs, "ad_lstm");
    if (!steps || !hs) {
        S->failed = 1;
        return;
    }
    dgates = hs + L;
    flat[0] = L * N;
    flat[1] = x->shape[2];
    pre = ad__rnn_products_recorded(T, ad_reshape(T, x, 2, flat), w_ih, b_ih, NULL, NULL, b_hh);
    for (t = 0; t < L; t++) { /* hs[t]: the h that step t reads */
        hs[t] = t ? ad_mul(T, steps[t - 1].o, steps[t - 1].tc) : h0;
        ad__lstm_rec_forward(T, ad_add(T, ad_slice(T, pre, 0, t * N, (t + 1) * N), ad_matmul_t(T, hs[t], w_hh, 0, 1)),
                             t ? steps[t - 1].cn : c0, H, &steps[t]);
    }
    gh = ad_reshape(T, ad_slice(T, g, 0, L - 1, L), 2, h0->shape);
    gc = ad_reshape(T, ad_slice(T, g, 0, L, L + 1), 2, h0->shape);
    for (t = L - 1; t >= 0; t--) {
        if (!(dgates[t] = ad__lstm_rec_backward(T, &steps[t], gh, gc, &dc))) {
            S->failed = 1;
            return;
        }
        gc = dc;
        if (t) gh = ad_add(T, ad_reshape(T, ad_slice(T, g, 0, t - 1, t), 2, h0->shape), ad_matmul(T, dgates[t], w_hh));
    }
    dall = ad_concat(T, dgates, L, 0);
    hprev = ad_concat(T, hs, L, 0);
    if (!dall || !hprev) {
        S->failed = 1;
        return;
    }
    if (ad__wants(S, c0)) ad__accum(S, c0, dc, 1);
    if (ad__wants(S, h0)) ad__accum(S, h0, ad_matmul(T, dgates[0], w_hh), 1);
    if (ad__wants(S, w_hh)) ad__accum(S, w_hh, ad_matmul_t(T, dall, hprev, 1, 0), 1);
    if (b_hh && ad__wants(S, b_hh)) ad__accum(S, b_hh, ad_sum_axis(T, dall, 0, 0), 1);
    ad__rnn_product_grads_recorded(S, x, w_ih, b_ih, dall);
}

AD__PRIVATE void ad__lstm_layer_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *h0 = n->in[1], *c0 = n->in[2], *w_hh = n->in[4], *b_ih, *b_hh;
    int L = x->shape[0], N = x->shape[1], H = h0->shape[1], G = 4 * H, t, add;
    size_t plane = (size_t)N * H;
    const ad_real *y = n->out->data, *c_all = n->st.rnn.aux + (size_t)L * plane;
    ad_real *dgates, *dh, *dc, *d;
    ad__lstm_job job;
    if (S->create_graph) {
        ad__lstm_layer_recorded(S, n, g);
        return;
    }
    ad__rnn_biases(n, 5, &b_ih, &b_hh);
    dgates = (ad_real *)ad__alloc(T, (size_t)L * 4 * plane * sizeof(ad_real), "ad_lstm");
    dh = (ad_real *)ad__alloc(T, 2 * plane * sizeof(ad_real), "ad_lstm");
    if (!dgates || !dh) {
        S->failed = 1;
        return;
    }
    dc = dh + plane;
    memcpy(dh, g->data + (size_t)(L - 1) * plane, plane * sizeof(ad_real));
    memcpy(dc, g->data + (size_t)L * plane, plane * sizeof(ad_real));
    job.hn = job.cn = NULL;
    job.gh = dh;
    job.gc = dc;
    job.H = H;
    for (t = L - 1; t >= 0 && !S->failed; t--) { /* dh and dc: step t's, then step t - 1's */
        job.gates = (ad_real *)n->st.rnn.gates + (size_t)t * 4 * plane;
        job.tc = (ad_real *)n->st.rnn.aux + (size_t)t * plane;
        job.c = t ? c_all + (size_t)(t - 1) * plane : c0->data;
        job.dgates = dgates + (size_t)t * 4 * plane;
        job.dc = dc; /* dc' read, then dc written, element by element */
        job.add = 0;
        if (!t) job.dc = ad__wants(S, c0) ? ad__grad_target(S, c0, &job.add) : NULL;
        if (!t && ad__wants(S, c0) && !job.dc) S->failed = 1;
        ad__parallel_items(T, ad__lstm_backward_range, &job, (size_t)N, (size_t)H * 4, 1);
        if (t) {
            memcpy(dh, g->data + (size_t)(t - 1) * plane, plane * sizeof(ad_real));
            if (ad__gemm(T, 0, 0, N, H, G, job.dgates, G, w_hh->data, H, dh, H, 1) != 0) S->failed = 1;
        }
    }
    if (!S->failed && ad__wants(S, h0) &&
        (!(d = ad__grad_target(S, h0, &add)) || ad__gemm(T, 0, 0, N, H, G, dgates, G, w_hh->data, H, d, H, add) != 0))
        S->failed = 1;
    if (!S->failed && ad__rnn_layer_w_hh_grad(S, w_hh, dgates, h0->data, y, L, N) != 0) S->failed = 1;
    if (!S->failed) ad__rnn_product_grads(S, x, n->in[3], NULL, dgates);
    if (!S->failed) ad__rnn_bias_pair_grad(S, "ad_lstm", b_ih, b_hh, dgates, (size_t)L * N);
    if (S->failed && !T->has_error) ad__fail(T, "ad_lstm: out of memory in the backward sweep");
}

/* Steps of a layer of L steps of N rows whose input projections are one product, when the tape
   keeps nothing for a backward sweep (ad__would_record): at most AD__RNN_CHUNK_ROWS rows' worth
   (at least one step), in chunks of equal size but for the last, so none is a small tail. */
AD__INLINE int ad__rnn_chunk_steps(int L, int N)
{
    int most = AD__RNN_CHUNK_ROWS / N > 1 ? AD__RNN_CHUNK_ROWS / N : 1, chunks = (L + most - 1) / most;
    return (L + chunks - 1) / chunks;
}

/* w_ih^T and w_hh^T of a layer of L steps of N rows packed once, in the tape's room for
   packed operands, where several products read them: w_hh^T when there is more than one step,
   w_ih^T when the input products go in more than one chunk of `chunk` steps (one product
   packs it as well itself), neither for products small enough for plain loops. ih and hh say
   what was packed; without memory nothing is, and the products pack their B themselves. */
AD__PRIVATE void ad__rnn_prepack(ad_tape *T, const ad_tensor *w_ih, const ad_tensor *w_hh, int L, int N, int chunk,
                                 ad__packed_b *ih, ad__packed_b *hh)
{
    int G = w_hh->shape[0], I = w_ih->shape[1], H = w_hh->shape[1];
    int pack_ih = chunk < L && !ad__gemm_is_small(chunk * N, G, I), pack_hh = L > 1 && !ad__gemm_is_small(N, G, H);
    size_t n_ih = pack_ih ? ad__packed_bt_values(G, I) : 0, n_hh = pack_hh ? ad__packed_bt_values(G, H) : 0;
    ad_real *room = n_ih + n_hh && !T->bf16 ? ad__panels_room(T, n_ih + n_hh) : NULL;
    ad__gemm_prepack_bt(T, G, I, w_ih->data, I, room && pack_ih ? room : NULL, ih);
    ad__gemm_prepack_bt(T, G, H, w_hh->data, H, room && pack_hh ? room + n_ih : NULL, hh);
}

/* A layer's product found no memory for its packing buffer: recorded, and NULL returned. */
AD__COLD ad_tensor *ad__rnn_out_of_memory(ad_tape *T, const char *op)
{
    ad__fail(T, "%s: out of memory for the packing buffer", op);
    return NULL;
}

/* A zero initial state [N, H] for a layer whose caller gives none, once ad__rnn_check has
   accepted x [L, N, I] and w_hh [gates H, H]. */
AD__PRIVATE ad_tensor *ad__rnn_zero_state(ad_tape *T, const ad_tensor *x, const ad_tensor *w_hh)
{
    int shape[2];
    shape[0] = x->shape[1];
    shape[1] = w_hh->shape[1];
    return ad_zeros(T, 2, shape);
}

AUTODIFF_API ad_tensor *ad_lstm(ad_tape *T, ad_tensor *x, ad_tensor *h0, ad_tensor *c0, ad_tensor *w_ih,
                                ad_tensor *w_hh, ad_tensor *b_ih, ad_tensor *b_hh, ad_tensor **h_n, ad_tensor **c_n)
{
    ad__lstm_job job;
    ad__packed_b ih, hh;
    ad_tensor *y, *ins[7], *out, *hl = NULL, *cl = NULL;
    ad_real *gates, *aux;
    const ad_real *h, *c;
    int shape[3], L, N, H, t, t0, chunk, keep, failed = 0;
    size_t plane;
    if (h_n) *h_n = NULL;
    if (c_n) *c_n = NULL;
    if (!T || !x || !w_ih || !w_hh) return NULL;
    if (!ad__rnn_check(T, "ad_lstm", 1, 4, x, h0, c0, w_ih, w_hh, b_ih, b_hh)) return NULL;
    if ((!h0 && !(h0 = ad__rnn_zero_state(T, x, w_hh))) || (!c0 && !(c0 = ad__rnn_zero_state(T, x, w_hh))))
        return NULL;
    L = x->shape[0];
    N = x->shape[1];
    H = h0->shape[1];
    plane = (size_t)N * H;
    ins[0] = x;
    ins[1] = h0;
    ins[2] = c0;
    ins[3] = w_ih;
    ins[4] = w_hh;
    ins[5] = b_ih;
    ins[6] = b_hh;
    keep = ad__would_record(T, ins, 7);
    chunk = keep ? L : ad__rnn_chunk_steps(L, N);
    shape[0] = L + 1;
    shape[1] = N;
    shape[2] = H;
    y = ad__tensor(T, "ad_lstm", 3, shape, 1);
    /* kept for the backward: every step's gates, tanh(c) and c; else a chunk's gates, one
       tanh(c) and two c, this step's and the last */
    gates = (ad_real *)ad__alloc(T, (size_t)chunk * 4 * plane * sizeof(ad_real), "ad_lstm");
    aux = (ad_real *)ad__alloc(T, (keep ? (size_t)L * 2 : 3) * plane * sizeof(ad_real), "ad_lstm");
    if (!y || !gates || !aux) return NULL;
    job.H = H;
    h = h0->data;
    c = c0->data;
    ad__rnn_prepack(T, w_ih, w_hh, L, N, chunk, &ih, &hh);
    for (t0 = 0; t0 < L && !failed; t0 += chunk) {
        int steps = L - t0 < chunk ? L - t0 : chunk;
        /* b_ih + b_hh + the chunk's x w_ih^T, in one product */
        failed = ad__rnn_products(T, gates, 4 * H, steps * N, x->data + (size_t)t0 * N * x->shape[2], w_ih, &ih, b_ih,
                                  NULL, NULL, b_hh) != 0;
        for (t = t0; t < t0 + steps && !failed; t++) {
            job.gates = gates + (size_t)(t - t0) * 4 * plane;
            job.tc = keep ? aux + (size_t)t * plane : aux;
            job.hn = y->data + (size_t)t * plane;
            job.cn = keep ? aux + (size_t)(L + t) * plane : aux + (size_t)(1 + t % 2) * plane;
            failed = ad__lstm_layer_step(T, &job, h, c, w_hh, &hh, N) != 0;
            h = job.hn;
            c = job.cn;
        }
    }
    if (failed) return ad__rnn_out_of_memory(T, "ad_lstm");
    memcpy(y->data + (size_t)L * plane, c, plane * sizeof(ad_real));
    if (!ad__rnn_record(T, "ad_lstm", y, ad__lstm_layer_backward, ins, 5, b_ih, b_hh, gates, aux))
        return NULL;
    shape[0] = L;
    out = ad__rnn_part(T, "ad_lstm", y, 0, 3, shape);
    if (h_n) hl = ad__rnn_part(T, "ad_lstm", y, L - 1, 2, shape + 1);
    if (c_n) cl = ad__rnn_part(T, "ad_lstm", y, L, 2, shape + 1);
    if (!out || (h_n && !hl) || (c_n && !cl)) return NULL;
    if (h_n) *h_n = hl;
    if (c_n) *c_n = cl;
    return out;
}

/* The GRU's rows [lo, hi): gi = x w_ih^T + b_ih becomes r z n, gh = h w_hh^T + b_hh is kept
   (its n block is read by the backward), h' into y. */
typedef struct ad__gru_job {
    ad_real *gi, *gh, *y;
    const ad_real *h;
    const ad_real *g;           /* backward: dh' */
    ad_real *dgi, *dgh, *dh;    /* backward: d gi, d gh, and h's gradient buffer (NULL: not wanted) */
    int H, add;
} ad__gru_job;

AD__PRIVATE void ad__gru_forward_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__gru_job *j = (const ad__gru_job *)ctx;
    size_t r, H = (size_t)j->H, k;
    for (r = lo; r < hi; r++) {
        ad_real *gi = j->gi + r * 3 * H, *y = j->y + r * H;
        const ad_real *gh = j->gh + r * 3 * H, *h = j->h + r * H;
        for (k = 0; k < 2 * H; k++) gi[k] = gi[k] + gh[k];
        ad__rnn_sigmoid(gi, 2 * H);
        for (k = 0; k < H; k++) gi[2 * H + k] = gi[2 * H + k] + gi[k] * gh[2 * H + k];
        ad__rnn_tanh(gi + 2 * H, H);
        for (k = 0; k < H; k++) y[k] = (1 - gi[H + k]) * gi[2 * H + k] + gi[H + k] * h[k];
    }
}

/* d n = dh' (1 - z) (1 - n^2), d z = dh' (h - n) z (1 - z), d r = d n ghn r (1 - r) with ghn
   the n block of gh; d gi = [d r, d z, d n], d gh = [d r, d z, d n r], and dh (+)= dh' z. */
AD__PRIVATE void ad__gru_backward_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__gru_job *j = (const ad__gru_job *)ctx;
    size_t r, H = (size_t)j->H, k;
    for (r = lo; r < hi; r++) {
        const ad_real *gt = j->gi + r * 3 * H, *ghn = j->gh + r * 3 * H + 2 * H, *h = j->h + r * H;
        const ad_real *g = j->g + r * H;
        ad_real *di = j->dgi + r * 3 * H, *dh2 = j->dgh + r * 3 * H, *dh = j->dh ? j->dh + r * H : NULL;
        for (k = 0; k < H; k++) {
            ad_real rr = gt[k], z = gt[H + k], nn = gt[2 * H + k];
            ad_real dn = g[k] * (1 - z) * (1 - nn * nn), dz = g[k] * (h[k] - nn) * (z * (1 - z));
            ad_real dr = dn * ghn[k] * (rr * (1 - rr));
            di[k] = dh2[k] = dr;
            di[H + k] = dh2[H + k] = dz;
            di[2 * H + k] = dn;
            dh2[2 * H + k] = dn * rr;
            if (dh) dh[k] = (j->add ? dh[k] : 0) + g[k] * z;
        }
    }
}

/* One GRU step rebuilt with recorded ops, for sweeps that record: r, z and n from
   gi = x w_ih^T + b_ih and gh = h w_hh^T + b_hh, with gh's n block and the step's h. */
typedef struct ad__gru_rec {
    ad_tensor *r, *z, *n, *ghn, *h;
} ad__gru_rec;

/* Returns the step's h', recorded. */
AD__PRIVATE ad_tensor *ad__gru_rec_forward(ad_tape *T, ad_tensor *gi, ad_tensor *gh, ad_tensor *h, int H,
                                           ad__gru_rec *s)
{
    s->r = ad_sigmoid(T, ad_add(T, ad__rnn_block(T, gi, 0, H), ad__rnn_block(T, gh, 0, H)));
    s->z = ad_sigmoid(T, ad_add(T, ad__rnn_block(T, gi, 1, H), ad__rnn_block(T, gh, 1, H)));
    s->ghn = ad__rnn_block(T, gh, 2, H);
    s->n = ad_tanh(T, ad_add(T, ad__rnn_block(T, gi, 2, H), ad_mul(T, s->r, s->ghn)));
    s->h = h;
    return ad_add(T, ad_mul(T, ad_rsub_scalar(T, 1, s->z), s->n), ad_mul(T, s->z, h));
}

/* The step's derivative with recorded ops (the formulas of ad__gru_backward_range): d gi and
   d gh [N, 3H] from dh' (g), and h's share outside the products, dh' z, in *dh. Returns 0, or
   -1 when an op failed. */
AD__PRIVATE int ad__gru_rec_backward(ad_tape *T, const ad__gru_rec *s, ad_tensor *g, ad_tensor **dgi,
                                     ad_tensor **dgh, ad_tensor **dh)
{
    ad_tensor *dn, *dz, *dr, *parts[3];
    dn = ad_mul(T, g, ad_mul(T, ad_rsub_scalar(T, 1, s->z), ad_rsub_scalar(T, 1, ad_square(T, s->n))));
    dz = ad_mul(T, g, ad_mul(T, ad_sub(T, s->h, s->n), ad__rnn_sigmoid_slope(T, s->z)));
    dr = ad_mul(T, dn, ad_mul(T, s->ghn, ad__rnn_sigmoid_slope(T, s->r)));
    parts[0] = dr;
    parts[1] = dz;
    parts[2] = dn;
    *dgi = ad_concat(T, parts, 3, 1);
    parts[2] = ad_mul(T, dn, s->r);
    *dgh = ad_concat(T, parts, 3, 1);
    *dh = ad_mul(T, g, s->z);
    return *dgi && *dgh && *dh ? 0 : -1;
}

AD__PRIVATE void ad__gru_recorded(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *h = n->in[1], *w_ih = n->in[2], *w_hh = n->in[3], *b_ih, *b_hh, *dgi, *dgh, *dh;
    ad__gru_rec step;
    ad__rnn_biases(n, 4, &b_ih, &b_hh);
    ad__gru_rec_forward(T, ad__rnn_products_recorded(T, x, w_ih, b_ih, NULL, NULL, NULL),
                        ad__rnn_products_recorded(T, h, w_hh, b_hh, NULL, NULL, NULL), h, h->shape[1], &step);
    if (ad__gru_rec_backward(T, &step, g, &dgi, &dgh, &dh) != 0) {
        S->failed = 1;
        return;
    }
    if (ad__wants(S, h)) ad__accum(S, h, dh, 1);
    ad__rnn_product_grads_recorded(S, x, w_ih, b_ih, dgi);
    ad__rnn_product_grads_recorded(S, h, w_hh, b_hh, dgh);
}

AD__PRIVATE void ad__gru_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad__gru_job job;
    ad_tensor *x = n->in[0], *h = n->in[1], *b_ih, *b_hh;
    int rows = h->shape[0], H = h->shape[1];
    if (S->create_graph) {
        ad__gru_recorded(S, n, g);
        return;
    }
    ad__rnn_biases(n, 4, &b_ih, &b_hh);
    job.gi = (ad_real *)n->st.rnn.gates;
    job.gh = (ad_real *)n->st.rnn.aux;
    job.y = NULL;
    job.h = h->data;
    job.g = g->data;
    job.H = H;
    job.add = 0;
    job.dh = NULL;
    job.dgi = (ad_real *)ad__alloc(S->T, (size_t)rows * 6 * H * sizeof(ad_real), "ad_gru_cell");
    if (!job.dgi || (ad__wants(S, h) && !(job.dh = ad__grad_target(S, h, &job.add)))) {
        S->failed = 1;
        return;
    }
    job.dgh = job.dgi + (size_t)rows * 3 * H;
    ad__parallel_items(S->T, ad__gru_backward_range, &job, (size_t)rows, (size_t)H * 6, 1);
    ad__rnn_product_grads(S, x, n->in[2], b_ih, job.dgi);
    ad__rnn_product_grads(S, h, n->in[3], b_hh, job.dgh);
    if (S->failed && !S->T->has_error) ad__fail(S->T, "ad_gru_cell: out of memory in the backward sweep");
}

AUTODIFF_API ad_tensor *ad_gru_cell(ad_tape *T, ad_tensor *x, ad_tensor *h, ad_tensor *w_ih, ad_tensor *w_hh,
                                    ad_tensor *b_ih, ad_tensor *b_hh)
{
    ad__gru_job job;
    ad_tensor *y, *ins[6];
    int rows, H;
    if (!T || !x || !h || !w_ih || !w_hh) return NULL;
    if (!ad__rnn_check(T, "ad_gru_cell", 0, 3, x, h, NULL, w_ih, w_hh, b_ih, b_hh)) return NULL;
    rows = h->shape[0];
    H = h->shape[1];
    y = ad__like(T, "ad_gru_cell", h);
    job.gi = (ad_real *)ad__alloc(T, (size_t)rows * 6 * H * sizeof(ad_real), "ad_gru_cell");
    if (!y || !job.gi) return NULL;
    job.gh = job.gi + (size_t)rows * 3 * H;
    if (ad__rnn_products(T, job.gi, 3 * H, rows, x->data, w_ih, NULL, b_ih, NULL, NULL, NULL) != 0 ||
        ad__rnn_products(T, job.gh, 3 * H, rows, h->data, w_hh, NULL, b_hh, NULL, NULL, NULL) != 0) {
        ad__fail(T, "ad_gru_cell: out of memory for the packing buffer");
        return NULL;
    }
    job.y = y->data;
    job.h = h->data;
    job.H = H;
    ad__parallel_items(T, ad__gru_forward_range, &job, (size_t)rows, (size_t)H * 6, 1);
    ins[0] = x;
    ins[1] = h;
    ins[2] = w_ih;
    ins[3] = w_hh;
    if (!ad__rnn_record(T, "ad_gru_cell", y, ad__gru_backward, ins, 4, b_ih, b_hh, job.gi, job.gh))
        return NULL;
    return y;
}

/* ---- the GRU layer: a whole sequence in one entry ---------------------------------------------
   ad_gru runs ad_gru_cell's step over L time steps in one entry whose result [L, N, H] is the h
   of every step (h_n is a view of its last step). As in the LSTM layer, x w_ih^T + b_ih of all
   steps is one product of L N rows, the gradients of x and w_ih (from every step's d gi) one
   product each, and w_hh's (from every step's d gh) two; h w_hh^T + b_hh and dh stay products
   of N rows per step, with w_hh^T packed once per call. The tape keeps every step's activated
   r z n and h w_hh^T + b_hh; a call that is not recorded, one chunk's r z n and one step's
   h w_hh^T + b_hh, as the LSTM's. */

/* The recorded derivative: the layer rebuilt step by step with recorded ops, then the cell's
   recorded derivative taken back through the steps. */
AD__PRIVATE void ad__gru_layer_recorded(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *h0 = n->in[1], *w_ih = n->in[2], *w_hh = n->in[3], *b_ih, *b_hh;
    ad_tensor *gi, **hs, **dgi, **dgh, *h = h0, *gh, *dh = NULL, *dall_i, *dall_h, *hprev;
    ad__gru_rec *steps;
    int L = x->shape[0], N = x->shape[1], H = h0->shape[1], t, flat[2];
    ad__rnn_biases(n, 4, &b_ih, &b_hh);
    steps = (ad__gru_rec *)ad__alloc(T, (size_t)L * sizeof *steps, "ad_gru");
    hs = (ad_tensor **)ad__alloc(T, (size_t)3 * L * sizeof *hs, "ad_gru");
    if (!steps || !hs) {
        S->failed = 1;
        return;
    }
    dgi = hs + L;
    dgh = hs + 2 * L;
    flat[0] = L * N;
    flat[1] = x->shape[2];
    gi = ad__rnn_products_recorded(T, ad_reshape(T, x, 2, flat), w_ih, b_ih, NULL, NULL, NULL);
    for (t = 0; t < L; t++) { /* hs[t]: the h that step t reads */
        hs[t] = h;
        h = ad__gru_rec_forward(T, ad_slice(T, gi, 0, t * N, (t + 1) * N),
                                ad__rnn_products_recorded(T, h, w_hh, b_hh, NULL, NULL, NULL), h, H, &steps[t]);
    }
    gh = ad_reshape(T, ad_slice(T, g, 0, L - 1, L), 2, h0->shape);
    for (t = L - 1; t >= 0; t--) {
        if (ad__gru_rec_backward(T, &steps[t], gh, &dgi[t], &dgh[t], &dh) != 0) {
            S->failed = 1;
            return;
        }
        dh = ad_add(T, dh, ad_matmul(T, dgh[t], w_hh)); /* step t's gradient of the h it read */
        if (t) gh = ad_add(T, ad_reshape(T, ad_slice(T, g, 0, t - 1, t), 2, h0->shape), dh);
    }
    dall_i = ad_concat(T, dgi, L, 0);
    dall_h = ad_concat(T, dgh, L, 0);
    hprev = ad_concat(T, hs, L, 0);
    if (!dall_i || !dall_h || !hprev || !dh) {
        S->failed = 1;
        return;
    }
    if (ad__wants(S, h0)) ad__accum(S, h0, dh, 1);
    if (ad__wants(S, w_hh)) ad__accum(S, w_hh, ad_matmul_t(T, dall_h, hprev, 1, 0), 1);
    if (b_hh && ad__wants(S, b_hh)) ad__accum(S, b_hh, ad_sum_axis(T, dall_h, 0, 0), 1);
    ad__rnn_product_grads_recorded(S, x, w_ih, b_ih, dall_i);
}

AD__PRIVATE void ad__gru_layer_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *h0 = n->in[1], *w_hh = n->in[3], *b_ih, *b_hh;
    int L = x->shape[0], N = x->shape[1], H = h0->shape[1], G = 3 * H, t;
    size_t plane = (size_t)N * H;
    const ad_real *y = n->out->data;
    ad_real *dgi, *dgh, *dh, *dprev, *swap;
    ad__gru_job job;
    if (S->create_graph) {
        ad__gru_layer_recorded(S, n, g);
        return;
    }
    ad__rnn_biases(n, 4, &b_ih, &b_hh);
    dgi = (ad_real *)ad__alloc(T, (size_t)L * 6 * plane * sizeof(ad_real), "ad_gru");
    dh = (ad_real *)ad__alloc(T, 2 * plane * sizeof(ad_real), "ad_gru");
    if (!dgi || !dh) {
        S->failed = 1;
        return;
    }
    dgh = dgi + (size_t)L * 3 * plane;
    dprev = dh + plane;
    memcpy(dh, g->data + (size_t)(L - 1) * plane, plane * sizeof(ad_real));
    job.y = NULL;
    job.H = H;
    for (t = L - 1; t >= 0 && !S->failed; t--) { /* dh: step t's; dprev: the h it read */
        job.gi = (ad_real *)n->st.rnn.gates + (size_t)t * 3 * plane;
        job.gh = (ad_real *)n->st.rnn.aux + (size_t)t * 3 * plane;
        job.h = t ? y + (size_t)(t - 1) * plane : h0->data;
        job.g = dh;
        job.dgi = dgi + (size_t)t * 3 * plane;
        job.dgh = dgh + (size_t)t * 3 * plane;
        job.dh = dprev;
        job.add = 1;
        if (t) memcpy(dprev, g->data + (size_t)(t - 1) * plane, plane * sizeof(ad_real));
        else if (!ad__wants(S, h0)) job.dh = NULL;
        else if (!(job.dh = ad__grad_target(S, h0, &job.add))) S->failed = 1;
        ad__parallel_items(T, ad__gru_backward_range, &job, (size_t)N, (size_t)H * 6, 1);
        if (job.dh && ad__gemm(T, 0, 0, N, H, G, job.dgh, G, w_hh->data, H, job.dh, H, 1) != 0) S->failed = 1;
        swap = dh;
        dh = dprev;
        dprev = swap;
    }
    if (!S->failed && ad__rnn_layer_w_hh_grad(S, w_hh, dgh, h0->data, y, L, N) != 0) S->failed = 1;
    if (!S->failed && b_hh) ad__rnn_bias_grad(S, b_hh, dgh, (size_t)L * N);
    if (!S->failed) ad__rnn_product_grads(S, x, n->in[2], b_ih, dgi);
    if (S->failed && !T->has_error) ad__fail(T, "ad_gru: out of memory in the backward sweep");
}

AUTODIFF_API ad_tensor *ad_gru(ad_tape *T, ad_tensor *x, ad_tensor *h0, ad_tensor *w_ih, ad_tensor *w_hh,
                               ad_tensor *b_ih, ad_tensor *b_hh, ad_tensor **h_n)
{
    ad__gru_job job;
    ad__packed_b ih, hh;
    ad_tensor *y, *ins[6], *hl;
    ad_real *gi, *gh;
    int shape[3], L, N, H, t, t0, chunk, keep, failed = 0;
    size_t plane;
    if (h_n) *h_n = NULL;
    if (!T || !x || !w_ih || !w_hh) return NULL;
    if (!ad__rnn_check(T, "ad_gru", 1, 3, x, h0, NULL, w_ih, w_hh, b_ih, b_hh)) return NULL;
    if (!h0 && !(h0 = ad__rnn_zero_state(T, x, w_hh))) return NULL;
    L = x->shape[0];
    N = x->shape[1];
    H = h0->shape[1];
    plane = (size_t)N * H;
    ins[0] = x;
    ins[1] = h0;
    ins[2] = w_ih;
    ins[3] = w_hh;
    ins[4] = b_ih;
    ins[5] = b_hh;
    keep = ad__would_record(T, ins, 6);
    chunk = keep ? L : ad__rnn_chunk_steps(L, N);
    shape[0] = L;
    shape[1] = N;
    shape[2] = H;
    y = ad__tensor(T, "ad_gru", 3, shape, 1);
    /* kept for the backward: every step's gi and gh; else a chunk's gi and one gh */
    gi = (ad_real *)ad__alloc(T, (size_t)(chunk + (keep ? L : 1)) * 3 * plane * sizeof(ad_real), "ad_gru");
    if (!y || !gi) return NULL;
    gh = gi + (size_t)chunk * 3 * plane;
    job.H = H;
    job.h = h0->data;
    ad__rnn_prepack(T, w_ih, w_hh, L, N, chunk, &ih, &hh);
    for (t0 = 0; t0 < L && !failed; t0 += chunk) {
        int steps = L - t0 < chunk ? L - t0 : chunk;
        /* b_ih + the chunk's x w_ih^T in one product; b_hh + h w_hh^T step by step */
        failed = ad__rnn_products(T, gi, 3 * H, steps * N, x->data + (size_t)t0 * N * x->shape[2], w_ih, &ih, b_ih,
                                  NULL, NULL, NULL) != 0;
        for (t = t0; t < t0 + steps && !failed; t++) {
            job.gi = gi + (size_t)(t - t0) * 3 * plane;
            job.gh = keep ? gh + (size_t)t * 3 * plane : gh;
            job.y = y->data + (size_t)t * plane;
            if (b_hh) ad__rnn_bias_rows(job.gh, (size_t)N, 3 * H, b_hh, NULL);
            failed =
                ad__gemm_packed(T, 0, 1, N, 3 * H, H, job.h, H, w_hh->data, H, job.gh, 3 * H, b_hh != NULL, &hh) != 0;
            if (!failed) ad__parallel_items(T, ad__gru_forward_range, &job, (size_t)N, (size_t)H * 6, 1);
            job.h = job.y;
        }
    }
    if (failed) return ad__rnn_out_of_memory(T, "ad_gru");
    if (!ad__rnn_record(T, "ad_gru", y, ad__gru_layer_backward, ins, 4, b_ih, b_hh, gi, gh))
        return NULL;
    if (h_n) {
        if (!(hl = ad__rnn_part(T, "ad_gru", y, L - 1, 2, shape + 1))) return NULL;
        *h_n = hl;
    }
    return y;
}

/* >>ops:attention ---------------------------------------------------------------------------- */
/* Where an operand of pair p = (batch b, head h) lies: its rows (positions) start at
   b * batch + h * head and are row values apart. ad_attention's [B, H, T, D] operands are
   contiguous per pair; ad_self_attention's lie side by side in the rows of [B, T, 3 C]. */
typedef struct ad__attn_layout {
    size_t batch, head;
    ptrdiff_t row;
} ad__attn_layout;

/* The fused kernels work on one (batch, head) pair at a time, in square blocks of query rows
   by keys (AD__ATTN_BLOCK, or AD__ATTN_BLOCK_CAUSAL with the mask, whose blocks above the
   diagonal are skipped): the block's scores come from one small GEMM on the calling thread's
   packing buffers, the softmax runs along its rows, and another GEMM takes the block to the
   output. Each pair is one task, computed by the same code on whichever thread claims it, so
   the bits do not depend on the thread count. */
typedef struct ad__attn_job {
    const ad_real *q, *k, *v;
    ad__attn_layout lq, lk, lv, lo; /* q's also dq's, k's dk's, v's dv's; o's also g's */
    const char *op;                 /* the public op, for messages */
    int heads;                      /* H, to split a pair's index into (b, h) */
    ad_real *o, *lse;            /* forward: written; backward: o and lse read */
    const ad_real *g;            /* backward: the output's gradient */
    ad_real *gq, *gk, *gv;       /* backward: the inputs' gradients, NULL when not wanted */
    int add_q, add_k, add_v;
    ad_real *pack, *scratch;     /* per thread: AD__PACK_PER_THREAD and scratch_len values */
    size_t scratch_len;
    int bf16;                    /* the tape's kind of products, AD__BF16_* */
    int tq, tk, d, dv, causal;
    int bq, bk;                  /* query rows and keys of a block */
    ad_real scale;
} ad__attn_job;

/* The offset of pair p's first row in an operand of layout L. */
AD__INLINE size_t ad__attn_at(const ad__attn_job *j, const ad__attn_layout *L, int p)
{
    return (size_t)(p / j->heads) * L->batch + (size_t)(p % j->heads) * L->head;
}

/* The layout of [B, H, T, D] (contiguous) with t rows of d values a pair. */
AD__INLINE ad__attn_layout ad__attn_dense(int heads, int t, int d)
{
    ad__attn_layout L;
    L.head = (size_t)t * d;
    L.batch = L.head * (size_t)heads;
    L.row = d;
    return L;
}

/* The public op of an attention entry or job: ad_self_attention's have heads, ad_attention's 0. */
AD__INLINE const char *ad__attn_op(int heads)
{
    return heads ? "ad_self_attention" : "ad_attention";
}

/* Zeroes rows of width values, row values apart: in one go when they are contiguous. */
AD__INLINE void ad__attn_clear(ad_real *x, int rows, int width, ptrdiff_t row)
{
    int r;
    if (row == width) {
        memset(x, 0, (size_t)rows * width * sizeof(ad_real));
        return;
    }
    for (r = 0; r < rows; r++) memset(x + r * row, 0, (size_t)width * sizeof(ad_real));
}

/* Keys of the block starting at key j0 (nk of them) that query row i sees. */
AD__INLINE int ad__attn_valid(const ad__attn_job *j, int i, int j0, int nk)
{
    int last = i - j0 + 1;
    if (!j->causal) return nk;
    return last < 0 ? 0 : last < nk ? last : nk;
}

/* exp of n values in place, with the vector exp where there is one. */
AD__INLINE void ad__attn_exp(ad_real *x, size_t n)
{
    size_t i;
    if (ad__unary_vectorised(AD__U_EXP, x, x, n)) return;
    for (i = 0; i < n; i++) x[i] = AD__F(exp)(x[i]);
}

/* The keys that the query rows [i0, i0 + nq) see: all of them, or up to the last row's. */
AD__INLINE int ad__attn_key_end(const ad__attn_job *j, int i0, int nq)
{
    return j->causal && i0 + nq < j->tk ? i0 + nq : j->tk;
}

/* Forward of pair p: o = softmax(q k^T scale + mask) v and lse, its rows' log-sum-exp. */
AD__PRIVATE void ad__attn_forward_task(void *ctx, int p, int thread)
{
    const ad__attn_job *j = (const ad__attn_job *)ctx;
    int d = j->d, dv = j->dv, bq = j->bq, bk = j->bk, i0, j0, r, c;
    ptrdiff_t sq = j->lq.row, sk = j->lk.row, sv = j->lv.row, so = j->lo.row;
    const ad_real *q = j->q + ad__attn_at(j, &j->lq, p), *k = j->k + ad__attn_at(j, &j->lk, p);
    const ad_real *v = j->v + ad__attn_at(j, &j->lv, p);
    ad_real *o = j->o + ad__attn_at(j, &j->lo, p), *lse = j->lse + (size_t)p * j->tq;
    ad_real *pack = j->pack + (size_t)thread * AD__PACK_PER_THREAD;
    ad_real *s = j->scratch + (size_t)thread * j->scratch_len;
    ad_real *m = s + bq * bk, *l = m + bq, *alpha = l + bq;
    for (i0 = 0; i0 < j->tq; i0 += bq) {
        int nq = j->tq - i0 < bq ? j->tq - i0 : bq, kend = ad__attn_key_end(j, i0, nq);
        for (j0 = 0; j0 < kend; j0 += bk) {
            int nk = kend - j0 < bk ? kend - j0 : bk;
            /* s = q_i k_j^T scale, less each row's running maximum; keys a row does not see are
               0 before the exp and after it */
            ad__gemm_alone(j->bf16, pack, 0, 1, nq, nk, d, q + i0 * sq, sq, k + j0 * sk, sk, s, nk, 0);
            for (r = 0; r < nq; r++) {
                ad_real *row = s + (size_t)r * nk, mx;
                int valid = ad__attn_valid(j, i0 + r, j0, nk);
                for (c = 0; c < valid; c++) row[c] *= j->scale;
                for (c = valid; c < nk; c++) row[c] = 0;
                if (valid == 0) {
                    alpha[r] = 1; /* the first block always has a key for every row */
                    continue;
                }
                mx = ad__max8(row, (size_t)valid);
                if (j0 == 0) {
                    m[r] = mx;
                    l[r] = 0;
                    alpha[r] = 0;
                } else {
                    ad_real mn = mx > m[r] ? mx : m[r];
                    alpha[r] = AD__F(exp)(m[r] - mn);
                    m[r] = mn;
                }
                for (c = 0; c < valid; c++) row[c] -= m[r];
            }
            ad__attn_exp(s, (size_t)nq * nk);
            for (r = 0; r < nq; r++) {
                ad_real *row = s + (size_t)r * nk;
                int valid = ad__attn_valid(j, i0 + r, j0, nk);
                for (c = valid; c < nk; c++) row[c] = 0;
                l[r] = l[r] * alpha[r] + ad__sum8(row, (size_t)valid);
                if (j0 > 0 && alpha[r] != 1) {
                    ad_real *orow = o + (i0 + r) * so;
                    for (c = 0; c < dv; c++) orow[c] *= alpha[r];
                }
            }
            ad__gemm_alone(j->bf16, pack, 0, 0, nq, dv, nk, s, nk, v + j0 * sv, sv, o + i0 * so, so, j0 > 0);
        }
        for (r = 0; r < nq; r++) {
            ad_real *orow = o + (i0 + r) * so, inv = 1 / l[r];
            for (c = 0; c < dv; c++) orow[c] *= inv;
            lse[i0 + r] = m[r] + AD__F(log)(l[r]);
        }
    }
}

/* Backward of pair p (FlashAttention-2's): with D_i = sum(g_i o_i), per block
   P = exp(q_i k_j^T scale - lse_i), dv_j += P^T g_i, dS = P (g_i v_j^T - D_i) scale,
   dq_i += dS k_j and dk_j += dS^T q_i. */
AD__PRIVATE void ad__attn_backward_task(void *ctx, int p, int thread)
{
    const ad__attn_job *j = (const ad__attn_job *)ctx;
    int d = j->d, dv = j->dv, bq = j->bq, bk = j->bk, i0, j0, r, c;
    ptrdiff_t sq = j->lq.row, sk = j->lk.row, sv = j->lv.row, so = j->lo.row;
    size_t qo = ad__attn_at(j, &j->lq, p), ko = ad__attn_at(j, &j->lk, p), vo = ad__attn_at(j, &j->lv, p);
    size_t oo = ad__attn_at(j, &j->lo, p);
    const ad_real *q = j->q + qo, *k = j->k + ko, *v = j->v + vo, *o = j->o + oo, *g = j->g + oo;
    const ad_real *lse = j->lse + (size_t)p * j->tq;
    ad_real *dq = j->gq ? j->gq + qo : NULL, *dk = j->gk ? j->gk + ko : NULL, *dvp = j->gv ? j->gv + vo : NULL;
    ad_real *pack = j->pack + (size_t)thread * AD__PACK_PER_THREAD;
    ad_real *s = j->scratch + (size_t)thread * j->scratch_len, *ds = s + bq * bk;
    ad_real *dsum = ds + bq * bk;
    /* fresh buffers first: where two of q, k and v are one tensor, the later target adds */
    if (dq && !j->add_q) ad__attn_clear(dq, j->tq, d, sq);
    if (dk && !j->add_k) ad__attn_clear(dk, j->tk, d, sk);
    if (dvp && !j->add_v) ad__attn_clear(dvp, j->tk, dv, sv);
    for (r = 0; r < j->tq; r++) dsum[r] = ad__dot8(g + r * so, o + r * so, (size_t)dv);
    for (j0 = 0; j0 < j->tk; j0 += bk) {
        int nk = j->tk - j0 < bk ? j->tk - j0 : bk;
        for (i0 = j->causal ? j0 / bq * bq : 0; i0 < j->tq; i0 += bq) {
            int nq = j->tq - i0 < bq ? j->tq - i0 : bq;
            ad__gemm_alone(j->bf16, pack, 0, 1, nq, nk, d, q + i0 * sq, sq, k + j0 * sk, sk, s, nk, 0);
            for (r = 0; r < nq; r++) {
                ad_real *row = s + (size_t)r * nk, sub = lse[i0 + r];
                int valid = ad__attn_valid(j, i0 + r, j0, nk);
                for (c = 0; c < valid; c++) row[c] = row[c] * j->scale - sub;
                for (c = valid; c < nk; c++) row[c] = 0;
            }
            ad__attn_exp(s, (size_t)nq * nk);
            for (r = 0; r < nq; r++) {
                int valid = ad__attn_valid(j, i0 + r, j0, nk);
                for (c = valid; c < nk; c++) s[(size_t)r * nk + c] = 0;
            }
            if (dvp)
                ad__gemm_alone(j->bf16, pack, 1, 0, nk, dv, nq, s, nk, g + i0 * so, so, dvp + j0 * sv, sv, 1);
            if (!dq && !dk) continue;
            ad__gemm_alone(j->bf16, pack, 0, 1, nq, nk, dv, g + i0 * so, so, v + j0 * sv, sv, ds, nk, 0);
            for (r = 0; r < nq; r++) {
                const ad_real *prow = s + (size_t)r * nk;
                ad_real *row = ds + (size_t)r * nk, sub = dsum[i0 + r];
                for (c = 0; c < nk; c++) row[c] = prow[c] * (row[c] - sub) * j->scale;
            }
            if (dq)
                ad__gemm_alone(j->bf16, pack, 0, 0, nq, d, nk, ds, nk, k + j0 * sk, sk, dq + i0 * sq, sq, 1);
            if (dk)
                ad__gemm_alone(j->bf16, pack, 1, 0, nk, d, nq, ds, nk, q + i0 * sq, sq, dk + j0 * sk, sk, 1);
        }
    }
}

/* Runs the forward or the backward tasks of job (B H pairs) over the tape's threads once the
   work is large enough, with per-thread packing buffers and scratch. Returns 0, or -1 (with the
   tape's error set) when memory runs out. */
AD__PRIVATE int ad__attn_run(ad_tape *T, ad__attn_job *job, int backward, int pairs)
{
    double macs = (double)pairs * job->tq * job->tk * (job->d + job->dv);
    int threads = macs >= AD__SPLIT_MACS && pairs > 1 ? ad__thread_count(T) : 1, p;
    ad__task_fn fn = backward ? ad__attn_backward_task : ad__attn_forward_task;
    size_t block;
    job->bq = job->bk = job->causal ? AD__ATTN_BLOCK_CAUSAL : AD__ATTN_BLOCK;
    block = (size_t)job->bq * job->bk;
    /* forward: the block and three values per row; backward: two blocks and D_i of every row */
    job->scratch_len = backward ? 2 * block + (size_t)job->tq : block + 3 * (size_t)job->bq;
    job->scratch_len = (job->scratch_len + 15) / 16 * 16; /* whole lines: each thread's stays aligned */
    job->scratch = (ad_real *)ad__alloc(T, job->scratch_len * (size_t)threads * sizeof(ad_real), job->op);
    if (!job->scratch) return -1;
    job->pack = ad__gemm_buffers(T, threads, 0);
    job->bf16 = T->bf16;
    if (!job->pack) {
        ad__fail(T, "%s: out of memory for the packing buffer", job->op);
        return -1;
    }
    if (threads > 1) ad__parallel(T, fn, job, pairs);
    else
        for (p = 0; p < pairs; p++) fn(job, p, 0);
    return 0;
}

/* The softmax probabilities of the scores, recorded with ops (for create_graph sweeps). */
AD__PRIVATE ad_tensor *ad__attn_probs(ad_tape *T, ad_tensor *q, ad_tensor *k, const ad__attention_state *st)
{
    ad_tensor *s = ad_mul_scalar(T, ad_matmul_t(T, q, k, 0, 1), st->scale);
    if (!s) return NULL;
    if (st->causal) {
        int shape[2], i, c;
        ad_tensor *mask;
        shape[0] = q->shape[2];
        shape[1] = k->shape[2];
        mask = ad__tensor(T, ad__attn_op(st->heads), 2, shape, 1);
        if (!mask) return NULL;
        for (i = 0; i < shape[0]; i++)
            for (c = 0; c < shape[1]; c++) mask->data[(size_t)i * shape[1] + c] = c > i;
        /* a finite fill: its exp is 0 all the same, and anomaly mode sees no Inf */
        s = ad_masked_fill(T, s, mask, (ad_real)-1e30);
    }
    return ad_softmax(T, s, -1);
}

/* The job's operands, shapes and layouts: ad_attention's q, k and v [B, H, T, D] (heads 0),
   or ad_self_attention's qkv [B, T, 3 C] split into heads of D = C / heads (q, k and v all
   qkv). The outputs o and lse, the gradients and the settings are left to the caller. */
AD__PRIVATE void ad__attn_geometry(ad__attn_job *job, const ad_tensor *q, const ad_tensor *k, const ad_tensor *v,
                                   int heads)
{
    memset(job, 0, sizeof *job);
    job->op = ad__attn_op(heads);
    if (heads == 0) {
        job->heads = q->shape[1];
        job->tq = q->shape[2];
        job->tk = k->shape[2];
        job->d = q->shape[3];
        job->dv = v->shape[3];
        job->q = q->data;
        job->k = k->data;
        job->v = v->data;
        job->lq = ad__attn_dense(job->heads, job->tq, job->d);
        job->lk = ad__attn_dense(job->heads, job->tk, job->d);
        job->lv = ad__attn_dense(job->heads, job->tk, job->dv);
        job->lo = ad__attn_dense(job->heads, job->tq, job->dv);
        return;
    }
    job->heads = heads;
    job->tq = job->tk = q->shape[1];
    job->d = job->dv = q->shape[2] / 3 / heads;
    job->q = q->data;
    job->k = q->data + (size_t)heads * job->d;
    job->v = q->data + 2 * (size_t)heads * job->d;
    job->lq.batch = (size_t)job->tq * q->shape[2];
    job->lq.head = (size_t)job->d;
    job->lq.row = q->shape[2];
    job->lk = job->lv = job->lq;
    job->lo.batch = (size_t)job->tq * heads * job->d;
    job->lo.head = (size_t)job->d;
    job->lo.row = (ptrdiff_t)heads * job->d;
}

/* dq, dk and dv recorded with ops (create_graph sweeps), from q, k and v [B, H, T, D] and the
   output's gradient g of their shape; each NULL when not wanted (want_*). */
AD__PRIVATE void ad__attn_recorded(ad_tape *T, ad_tensor *q, ad_tensor *k, ad_tensor *v, ad_tensor *g,
                                   const ad__attention_state *st, int want_q, int want_k, int want_v,
                                   ad_tensor **dq, ad_tensor **dk, ad_tensor **dv)
{
    ad_tensor *p = ad__attn_probs(T, q, k, st), *dp, *ds;
    *dq = *dk = *dv = NULL;
    if (want_v) *dv = ad_matmul_t(T, p, g, 1, 0);
    if (!want_q && !want_k) return;
    /* the softmax's derivative, then the scale: dS = P (dP - sum(dP P)) scale */
    dp = ad_matmul_t(T, g, v, 0, 1);
    ds = ad_mul_scalar(T, ad_mul(T, p, ad_sub(T, dp, ad_sum_axis(T, ad_mul(T, dp, p), -1, 1))), st->scale);
    if (want_q) *dq = ad_matmul(T, ds, k);
    if (want_k) *dk = ad_matmul_t(T, ds, q, 1, 0);
}

/* ad_self_attention's qkv [B, T, 3 C] as q, k and v [B, H, T, D], with recorded ops. */
AD__PRIVATE void ad__attn_split_heads(ad_tape *T, ad_tensor *qkv, int heads, ad_tensor **parts)
{
    static const int to_heads[5] = {2, 0, 3, 1, 4};
    int split[5], shape[4], i;
    ad_tensor *x;
    split[0] = shape[0] = qkv->shape[0];
    split[1] = shape[2] = qkv->shape[1];
    split[2] = 3;
    split[3] = shape[1] = heads;
    split[4] = shape[3] = qkv->shape[2] / 3 / heads;
    x = ad_permute(T, ad_reshape(T, qkv, 5, split), to_heads); /* [3, B, H, T, D] */
    for (i = 0; i < 3; i++) parts[i] = ad_reshape(T, ad_slice(T, x, 0, i, i + 1), 4, shape);
}

/* The fused backward of a plain sweep: the gradients added straight into their buffers. A
   self-attention's q, k and v share qkv's buffer, which is cleared once (when fresh) and then
   added into by every pair. Returns 0, or -1 when memory runs out. */
AD__PRIVATE int ad__attn_backward_fused(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tensor *q = n->in[0], *k = n->nin > 1 ? n->in[1] : q, *v = n->nin > 2 ? n->in[2] : q;
    const ad__attention_state *st = &n->st.attention;
    ad__attn_job job;
    ad__attn_geometry(&job, q, k, v, st->heads);
    job.o = n->out->data;
    job.lse = (ad_real *)st->lse;
    job.g = g->data;
    job.causal = st->causal;
    job.scale = st->scale;
    if (st->heads) {
        int add;
        ad_real *d;
        if (!ad__wants(S, q)) return 0;
        if (!(d = ad__grad_target(S, q, &add))) return -1;
        if (!add) memset(d, 0, q->size * sizeof(ad_real));
        job.gq = d;
        job.gk = d + (job.k - job.q);
        job.gv = d + (job.v - job.q);
        job.add_q = job.add_k = job.add_v = 1;
    } else if ((ad__wants(S, q) && !(job.gq = ad__grad_target(S, q, &job.add_q))) ||
               (ad__wants(S, k) && !(job.gk = ad__grad_target(S, k, &job.add_k))) ||
               (ad__wants(S, v) && !(job.gv = ad__grad_target(S, v, &job.add_v)))) {
        return -1;
    }
    return ad__attn_run(S->T, &job, 1, q->shape[0] * job.heads);
}

AD__PRIVATE void ad__attention_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    const ad__attention_state *st = &n->st.attention;
    ad_tensor *parts[3], *grads[3], *gh;
    int i;
    if (!S->create_graph) {
        if (ad__attn_backward_fused(S, n, g) != 0) {
            S->failed = 1;
            if (!T->has_error) ad__fail(T, "%s: out of memory in the backward sweep", n->op);
        }
        return;
    }
    if (!st->heads) {
        ad__attn_recorded(T, n->in[0], n->in[1], n->in[2], g, st, ad__wants(S, n->in[0]), ad__wants(S, n->in[1]),
                          ad__wants(S, n->in[2]), &grads[0], &grads[1], &grads[2]);
        for (i = 0; i < 3; i++)
            if (ad__wants(S, n->in[i])) ad__accum(S, n->in[i], grads[i], 1);
        return;
    }
    {
        /* qkv: the heads' gradients of q, k and v stacked, then put back in qkv's layout */
        static const int merge_g[4] = {0, 2, 1, 3}, from_heads[5] = {1, 3, 0, 2, 4};
        ad_tensor *qkv = n->in[0];
        int shape[4];
        ad__attn_split_heads(T, qkv, st->heads, parts);
        shape[0] = qkv->shape[0];
        shape[1] = qkv->shape[1];
        shape[2] = st->heads;
        shape[3] = qkv->shape[2] / 3 / st->heads;
        gh = ad_permute(T, ad_reshape(T, g, 4, shape), merge_g); /* [B, H, T, D] */
        ad__attn_recorded(T, parts[0], parts[1], parts[2], gh, st, 1, 1, 1, &grads[0], &grads[1], &grads[2]);
        ad__accum(S, qkv, ad_reshape(T, ad_permute(T, ad_stack(T, grads, 3, 0), from_heads), 3, qkv->shape), 1);
    }
}

/* The scale both attention ops use: the caller's, or 1 / sqrt(D) for 0. */
AD__INLINE ad_real ad__attn_scale(ad_real scale, int d)
{
    return scale == 0 ? 1 / AD__F(sqrt)((ad_real)d) : scale;
}

/* Runs the forward of job (its geometry set) into a new output of the given shape and records
   it with inputs ins (heads as ad__attn_geometry's); lse gets B H T values. Returns the output,
   or NULL. */
AD__PRIVATE ad_tensor *ad__attn_forward(ad_tape *T, ad__attn_job *job, int ndim, const int *shape, ad_tensor **ins,
                                        int nin, int heads)
{
    const char *op = job->op;
    int pairs = shape[0] * job->heads;
    ad_tensor *y = ad__tensor(T, op, ndim, shape, 1);
    ad_real *lse = (ad_real *)ad__alloc(T, (size_t)pairs * job->tq * sizeof(ad_real), op);
    ad__node *node;
    if (!y || !lse) return NULL;
    job->o = y->data;
    job->lse = lse;
    if (ad__attn_run(T, job, 0, pairs) != 0) return NULL;
    node = ad__record(T, op, y, ad__attention_backward, ins, nin);
    if (!node) return NULL;
    node->st.attention.lse = lse;
    node->st.attention.scale = job->scale;
    node->st.attention.causal = job->causal;
    node->st.attention.heads = heads;
    return y;
}

AUTODIFF_API ad_tensor *ad_attention(ad_tape *T, ad_tensor *q, ad_tensor *k, ad_tensor *v, int causal,
                                     ad_real scale)
{
    int shape[4];
    ad_tensor *ins[3];
    ad__attn_job job;
    char sq[96], sk[96], sv[96];
    const char *why = NULL;
    if (!T || !q || !k || !v) return NULL;
    if (!ad__on_tape(T, "ad_attention", "q", q) || !ad__on_tape(T, "ad_attention", "k", k) ||
        !ad__on_tape(T, "ad_attention", "v", v))
        return NULL;
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) why = "each must be [B, H, T, D]";
    else if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] ||
             v->shape[1] != q->shape[1])
        why = "B and H must agree";
    else if (v->shape[2] != k->shape[2]) why = "k and v must have as many keys";
    else if (k->shape[3] != q->shape[3]) why = "q and k must have the same D";
    else if (!(scale - scale == 0)) why = "scale must be finite";
    if (why) {
        ad__fail(T, "ad_attention: q %s, k %s, v %s: %s", ad_shape_str(q, sq, sizeof sq),
                 ad_shape_str(k, sk, sizeof sk), ad_shape_str(v, sv, sizeof sv), why);
        return NULL;
    }
    ad__attn_geometry(&job, q, k, v, 0);
    job.causal = causal != 0;
    job.scale = ad__attn_scale(scale, q->shape[3]);
    shape[0] = q->shape[0];
    shape[1] = q->shape[1];
    shape[2] = q->shape[2];
    shape[3] = v->shape[3];
    ins[0] = q;
    ins[1] = k;
    ins[2] = v;
    return ad__attn_forward(T, &job, 4, shape, ins, 3, 0);
}

AUTODIFF_API ad_tensor *ad_self_attention(ad_tape *T, ad_tensor *qkv, int heads, int causal, ad_real scale)
{
    int shape[3];
    ad__attn_job job;
    char s[96];
    const char *why = NULL;
    if (!T || !qkv) return NULL;
    if (!ad__on_tape(T, "ad_self_attention", "qkv", qkv)) return NULL;
    if (qkv->ndim != 3) why = "must be [B, T, 3 C]";
    else if (heads < 1) why = "heads must be at least 1";
    else if (qkv->shape[2] % 3 != 0 || qkv->shape[2] / 3 % heads != 0)
        why = "the last dimension must be a multiple of 3 heads";
    else if (!(scale - scale == 0)) why = "scale must be finite";
    if (why) {
        ad__fail(T, "ad_self_attention: qkv %s, heads %d: %s", ad_shape_str(qkv, s, sizeof s), heads, why);
        return NULL;
    }
    ad__attn_geometry(&job, qkv, qkv, qkv, heads);
    job.causal = causal != 0;
    job.scale = ad__attn_scale(scale, job.d);
    shape[0] = qkv->shape[0];
    shape[1] = qkv->shape[1];
    shape[2] = qkv->shape[2] / 3;
    return ad__attn_forward(T, &job, 3, shape, &qkv, 1, heads);
}

/* >>ops:embedding ---------------------------------------------------------------------------- */
AUTODIFF_API ad_tensor *ad_embedding(ad_tape *T, ad_tensor *weight, const int *indices, int n)
{
    int shape[2], i, V;
    const int *idx = indices;
    ad__gather_state st;
    char s[96];
    if (!T || !weight) return NULL;
    if (!ad__on_tape(T, "ad_embedding", "weight", weight)) return NULL;
    ad_shape_str(weight, s, sizeof s);
    if (weight->ndim != 2) {
        ad__fail(T, "ad_embedding: weight %s must be [V, D]", s);
        return NULL;
    }
    if (n < 1 || !indices) {
        ad__fail(T, "ad_embedding: weight %s: %s", s, indices ? "n must be at least 1" : "indices is NULL");
        return NULL;
    }
    V = weight->shape[0];
    for (i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= V) {
            ad__fail(T, "ad_embedding: weight %s: index %d (position %d) is outside 0..%d", s, indices[i], i,
                     V - 1);
            return NULL;
        }
    if (T->grad_enabled && weight->requires_grad) {
        /* the gradient's scatter reads them after the caller's array may be gone */
        int *copy = (int *)ad__alloc(T, (size_t)n * sizeof(int), "ad_embedding");
        if (!copy) return NULL;
        memcpy(copy, indices, (size_t)n * sizeof(int));
        idx = copy;
    }
    shape[0] = n;
    shape[1] = weight->shape[1];
    st.index = idx;
    st.rows = V;
    st.row_len = weight->shape[1];
    st.kind = AD__GATHER_EMBEDDING;
    st.tiles = 0;
    return ad__gather(T, weight, &st, 2, shape);
}

/* >>ops:loss --------------------------------------------------------------------------------- */
/* A [N, C] constant with 1 at (i, labels[i]). */
AD__PRIVATE ad_tensor *ad__one_hot(ad_tape *T, const int *labels, int rows, int classes)
{
    int shape[2], i;
    ad_tensor *t;
    shape[0] = rows;
    shape[1] = classes;
    t = ad_zeros(T, 2, shape);
    if (!t) return NULL;
    for (i = 0; i < rows; i++) t->data[(size_t)i * classes + labels[i]] = 1;
    return t;
}

AD__PRIVATE ad_tensor *ad__xent_grad(ad_tape *T, ad_tensor *logits, ad_tensor *g, const int *labels,
                                     const ad_real *probs);

/* The cross-entropy gradient (softmax - one_hot) * g / N is itself an op: its derivative with
   respect to the logits is the softmax Jacobian, and with respect to g the gradient divided
   by g. Both are written with ops, so cross-entropy has second derivatives. */
AD__PRIVATE void ad__xent_grad_backward(ad__sweep *S, ad__node *n, ad_tensor *v)
{
    ad_tape *T = S->T;
    ad_tensor *logits = n->in[0], *g = n->in[1], *p, *s, *pv;
    ad_real inv_rows = (ad_real)1 / (ad_real)logits->shape[0];
    p = ad_softmax(T, logits, 1);
    if (ad__wants(S, logits)) {
        s = ad_mul_scalar(T, g, inv_rows);
        pv = ad_mul(T, p, v);
        ad__accum(S, logits, ad_mul(T, ad_sub(T, pv, ad_mul(T, p, ad_sum_axis(T, pv, 1, 1))), s), 1);
    }
    if (ad__wants(S, g)) {
        ad_tensor *onehot = ad__one_hot(T, n->st.xent.labels, logits->shape[0], logits->shape[1]);
        ad_tensor *dg = ad_mul_scalar(T, ad_sum(T, ad_mul(T, v, ad_sub(T, p, onehot))), inv_rows);
        ad__accum_to(S, g, dg, 1);
    }
}

/* The gradient (softmax - one_hot) * g / N, from the softmax the forward pass kept (probs) or,
   without it, computed anew. */
AD__PRIVATE ad_tensor *ad__xent_grad(ad_tape *T, ad_tensor *logits, ad_tensor *g, const int *labels,
                                     const ad_real *probs)
{
    int rows, classes, i;
    ad_real scale;
    ad_tensor *y;
    ad__node *node;
    if (!logits || !g) return NULL;
    rows = logits->shape[0];
    classes = logits->shape[1];
    scale = g->data[0] / (ad_real)rows;
    y = ad__like(T, "ad_cross_entropy", logits);
    if (!y) return NULL;
    if (!probs) {
        ad__softmax_split(T, logits->data, y->data, (size_t)rows, (size_t)classes, 1, 0);
        probs = y->data;
    }
    for (i = 0; i < rows; i++) {
        const ad_real *p = probs + (size_t)i * classes;
        ad_real *row = y->data + (size_t)i * classes, at = (p[labels[i]] - 1) * scale;
        int j;
        for (j = 0; j < classes; j++) row[j] = p[j] * scale;
        row[labels[i]] = at;
    }
    node = ad__record2(T, "ad_cross_entropy", y, ad__xent_grad_backward, logits, g);
    if (!node) return NULL;
    node->st.xent.labels = labels;
    return y;
}

AD__PRIVATE void ad__xent_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad__accum(S, n->in[0], ad__xent_grad(S->T, n->in[0], g, n->st.xent.labels, (const ad_real *)n->saved), 1);
}

/* Rows [lo, hi) of a cross-entropy: each row's softmax into p and its loss m + log(s) - x[label]
   into loss, m being the row's largest logit and s the sum of exp(x - m). The exponentials of
   all these rows go through the vector exp in one call, which serves rows of ten classes as
   well as long ones. */
typedef struct ad__xent_job {
    const ad_real *x;
    const int *labels;
    size_t classes;
    ad_real *p;
    double *loss;
} ad__xent_job;

AD__PRIVATE void ad__xent_range(const void *ctx, size_t lo, size_t hi)
{
    const ad__xent_job *j = (const ad__xent_job *)ctx;
    size_t C = j->classes, n = (hi - lo) * C, r, k;
    const ad_real *x = j->x + lo * C;
    ad_real *p = j->p + lo * C;
    for (r = 0; r < hi - lo; r++) { /* each row's maximum waits in its loss slot */
        ad_real m = ad__max8(x + r * C, C);
        for (k = 0; k < C; k++) p[r * C + k] = x[r * C + k] - m;
        j->loss[lo + r] = m;
    }
    if (!ad__unary_vectorised(AD__U_EXP, p, p, n))
        for (k = 0; k < n; k++) p[k] = AD__F(exp)(p[k]);
    for (r = 0; r < hi - lo; r++) {
        ad_real *q = p + r * C, s = ad__sum8(q, C), inv = 1 / s, m = (ad_real)j->loss[lo + r];
        j->loss[lo + r] = (double)(m + AD__F(log)(s) - x[r * C + (size_t)j->labels[lo + r]]);
        for (k = 0; k < C; k++) q[k] *= inv;
    }
}

AUTODIFF_API ad_tensor *ad_cross_entropy(ad_tape *T, ad_tensor *logits, const int *labels)
{
    int rows, classes, i;
    int *saved;
    double total = 0;
    ad_tensor *y;
    ad__node *node;
    ad__xent_job job;
    char s[96];
    if (!T || !logits) return NULL;
    if (!ad__on_tape(T, "ad_cross_entropy", "logits", logits)) return NULL;
    if (logits->ndim != 2) {
        ad__fail(T, "ad_cross_entropy: logits %s must be [N, C]", ad_shape_str(logits, s, sizeof s));
        return NULL;
    }
    if (!labels) { ad__fail(T, "ad_cross_entropy: labels is NULL"); return NULL; }
    rows = logits->shape[0];
    classes = logits->shape[1];
    for (i = 0; i < rows; i++)
        if (labels[i] < 0 || labels[i] >= classes) {
            ad__fail(T, "ad_cross_entropy: logits %s: label %d of row %d is outside 0..%d",
                     ad_shape_str(logits, s, sizeof s), labels[i], i, classes - 1);
            return NULL;
        }
    y = ad__tensor(T, "ad_cross_entropy", 0, NULL, 1);
    if (!y) return NULL;
    /* the softmax is kept for the backward pass, which then computes no exponentials */
    job.x = logits->data;
    job.labels = labels;
    job.classes = (size_t)classes;
    job.p = (ad_real *)ad__alloc(T, logits->size * sizeof(ad_real), "ad_cross_entropy");
    job.loss = (double *)ad__alloc(T, (size_t)rows * sizeof(double), "ad_cross_entropy");
    if (!job.p || !job.loss) return NULL;
    ad__parallel_items(T, ad__xent_range, &job, (size_t)rows, job.classes, ad__plane_block(job.classes));
    for (i = 0; i < rows; i++) total += job.loss[i];
    y->data[0] = (ad_real)(total / rows);
    node = ad__record1(T, "ad_cross_entropy", y, ad__xent_backward, logits);
    if (!node) return NULL;
    if (node != &T->sink) {
        saved = (int *)ad__alloc(T, (size_t)rows * sizeof(int), "ad_cross_entropy");
        if (!saved) return NULL;
        memcpy(saved, labels, (size_t)rows * sizeof(int));
        node->st.xent.labels = saved;
        node->saved = job.p;
    }
    return y;
}

/* Both losses below need equal shapes. */
AD__PRIVATE int ad__check_same(ad_tape *T, const char *op, const ad_tensor *a, const ad_tensor *b)
{
    char sa[96], sb[96];
    if (!ad__check_pair(T, op, a, b)) return 0;
    if (ad__same_shape(a, b)) return 1;
    ad__fail(T, "%s: shapes %s and %s differ; they must be equal", op, ad_shape_str(a, sa, sizeof sa),
             ad_shape_str(b, sb, sizeof sb));
    return 0;
}

AUTODIFF_API ad_tensor *ad_mse(ad_tape *T, ad_tensor *pred, ad_tensor *target)
{
    if (!T || !pred || !target) return NULL;
    if (!ad__check_same(T, "ad_mse", pred, target)) return NULL;
    return ad_mean(T, ad_square(T, ad_sub(T, pred, target)));
}

AD__PRIVATE void ad__bce_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *t = n->in[1];
    ad_tensor *s = ad_mul_scalar(T, g, (ad_real)1 / (ad_real)x->size);
    /* d/dx = sigmoid(x) - t, d/dt = -x, each times g / N */
    if (ad__wants(S, x)) ad__accum(S, x, ad_mul(T, ad_sub(T, ad_sigmoid(T, x), t), s), 1);
    if (ad__wants(S, t)) ad__accum(S, t, ad_mul(T, ad_neg(T, x), s), 1);
}

AUTODIFF_API ad_tensor *ad_bce_with_logits(ad_tape *T, ad_tensor *logits, ad_tensor *targets)
{
    double total = 0;
    size_t i;
    ad_tensor *y;
    if (!T || !logits || !targets) return NULL;
    if (!ad__check_same(T, "ad_bce_with_logits", logits, targets)) return NULL;
    y = ad__tensor(T, "ad_bce_with_logits", 0, NULL, 1);
    if (!y) return NULL;
    for (i = 0; i < logits->size; i++) {
        ad_real x = logits->data[i], t = targets->data[i];
        /* max(x, 0) - x t + log(1 + e^-|x|): never overflows */
        total += (double)((x > 0 ? x : 0) - x * t + AD__F(log1p)(AD__F(exp)(-AD__F(fabs)(x))));
    }
    y->data[0] = (ad_real)(total / (double)logits->size);
    if (!ad__record2(T, "ad_bce_with_logits", y, ad__bce_backward, logits, targets)) return NULL;
    return y;
}

/* NLL: a take of each row's labelled value (offset mode, a plane per row), whose mean is
   negated. The fused backward puts -g / N at those positions; recorded, it is the take's put. */
AD__PRIVATE void ad__nll_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    const ad__take *t = (const ad__take *)n->saved;
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0];
    ad_real v, *d;
    int rows = (int)t->out_size, add;
    size_t i;
    if (!ad__wants(S, x)) return;
    if (S->create_graph) {
        ad_tensor *each = ad_broadcast_to(T, ad_mul_scalar(T, g, (ad_real)-1 / (ad_real)rows), 1, &rows);
        ad__accum(S, x, ad__put_op(T, t, each, x->ndim, x->shape), 1);
        return;
    }
    if (!(d = ad__grad_target(S, x, &add))) return;
    if (!add) memset(d, 0, x->size * sizeof(ad_real));
    v = g->data[0] * ((ad_real)-1 / (ad_real)rows);
    for (i = 0; i < t->out_size; i++) d[t->offset[i]] += v;
}

AUTODIFF_API ad_tensor *ad_nll_loss(ad_tape *T, ad_tensor *logp, const int *labels)
{
    int rows, classes, i;
    double total = 0;
    ad__take *t;
    ad_tensor *y;
    ad__node *node;
    char s[96];
    if (!T || !logp) return NULL;
    if (!ad__on_tape(T, "ad_nll_loss", "logp", logp)) return NULL;
    ad_shape_str(logp, s, sizeof s);
    if (logp->ndim != 2) {
        ad__fail(T, "ad_nll_loss: logp %s must be [N, C]", s);
        return NULL;
    }
    if (!labels) {
        ad__fail(T, "ad_nll_loss: logp %s: labels is NULL", s);
        return NULL;
    }
    rows = logp->shape[0];
    classes = logp->shape[1];
    for (i = 0; i < rows; i++)
        if (labels[i] < 0 || labels[i] >= classes) {
            ad__fail(T, "ad_nll_loss: logp %s: label %d of row %d is outside 0..%d", s, labels[i], i, classes - 1);
            return NULL;
        }
    t = ad__take_new(T, "ad_nll_loss", (size_t)rows, logp->size, (size_t)rows, 0);
    y = ad__tensor(T, "ad_nll_loss", 0, NULL, 1);
    if (!t || !y) return NULL;
    for (i = 0; i < rows; i++) {
        t->offset[i] = (size_t)i * (size_t)classes + (size_t)labels[i];
        total += (double)logp->data[t->offset[i]];
    }
    y->data[0] = (ad_real)(-total / rows);
    node = ad__record1(T, "ad_nll_loss", y, ad__nll_backward, logp);
    if (!node) return NULL;
    node->saved = t;
    return y;
}

/* L1 and Huber losses: the gradient of pred is g / N times sign(d) or clamp(d, -delta, delta),
   d = pred - target, and target's its negation. Recorded, the sign is a constant and the clamp
   an op. */
typedef struct ad__huber_saved {
    ad_real delta; /* 0 for the L1 loss */
} ad__huber_saved;

AD__INLINE ad_real ad__l1_slope(ad_real d, ad_real delta)
{
    if (delta == 0) return d > 0 ? (ad_real)1 : (d < 0 ? (ad_real)-1 : d); /* 0 at 0; NaN stays NaN */
    return d < -delta ? -delta : (d > delta ? delta : d);
}

AD__PRIVATE void ad__l1_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    const ad__huber_saved *st = (const ad__huber_saved *)n->saved;
    const char *op = st->delta > 0 ? "ad_huber_loss" : "ad_l1_loss";
    ad_tape *T = S->T;
    ad_tensor *p = n->in[0], *t = n->in[1], *slope, *gs;
    ad_real scale = (ad_real)1 / (ad_real)p->size, v, *d;
    size_t i;
    int which, add;
    if (!S->create_graph) {
        for (which = 0; which < 2; which++) {
            ad_tensor *x = n->in[which];
            ad_real s = which ? -g->data[0] * scale : g->data[0] * scale;
            if (!ad__wants(S, x)) continue;
            if (!(d = ad__grad_target(S, x, &add))) return;
            for (i = 0; i < x->size; i++) {
                v = s * ad__l1_slope(p->data[i] - t->data[i], st->delta);
                d[i] = add ? d[i] + v : v;
            }
        }
        return;
    }
    if (st->delta > 0) {
        slope = ad_clamp(T, ad_sub(T, p, t), -st->delta, st->delta);
    } else if ((slope = ad__like(T, op, p)) != NULL) {
        for (i = 0; i < p->size; i++) slope->data[i] = ad__l1_slope(p->data[i] - t->data[i], 0);
    }
    gs = ad_mul_scalar(T, g, scale);
    if (ad__wants(S, p)) ad__accum(S, p, ad_mul(T, slope, gs), 1);
    if (ad__wants(S, t)) ad__accum(S, t, ad_mul(T, slope, ad_neg(T, gs)), 1);
}

AD__PRIVATE ad_tensor *ad__l1(ad_tape *T, const char *op, ad_tensor *pred, ad_tensor *target, ad_real delta)
{
    double total = 0;
    size_t i;
    ad_tensor *y;
    ad__node *node;
    ad__huber_saved *st = NULL;
    if (!ad__check_same(T, op, pred, target)) return NULL;
    if (T->grad_enabled && (pred->requires_grad || target->requires_grad) &&
        !(st = (ad__huber_saved *)ad__alloc_aligned(T, sizeof *st, 16, op)))
        return NULL;
    y = ad__tensor(T, op, 0, NULL, 1);
    if (!y) return NULL;
    for (i = 0; i < pred->size; i++) {
        ad_real d = pred->data[i] - target->data[i], a = AD__F(fabs)(d);
        if (delta == 0) total += (double)a;
        else total += (double)(a < delta ? (ad_real)0.5 * d * d : delta * (a - (ad_real)0.5 * delta));
    }
    y->data[0] = (ad_real)(total / (double)pred->size);
    node = ad__record2(T, op, y, ad__l1_backward, pred, target);
    if (!node) return NULL;
    if (st) {
        st->delta = delta;
        node->saved = st;
    }
    return y;
}

AUTODIFF_API ad_tensor *ad_l1_loss(ad_tape *T, ad_tensor *pred, ad_tensor *target)
{
    if (!T || !pred || !target) return NULL;
    return ad__l1(T, "ad_l1_loss", pred, target, 0);
}

AUTODIFF_API ad_tensor *ad_huber_loss(ad_tape *T, ad_tensor *pred, ad_tensor *target, ad_real delta)
{
    char sa[96], sb[96];
    if (!T || !pred || !target) return NULL;
    if (!(delta > 0)) {
        ad__fail(T, "ad_huber_loss: %s and %s: delta %g must be positive", ad_shape_str(pred, sa, sizeof sa),
                 ad_shape_str(target, sb, sizeof sb), (double)delta);
        return NULL;
    }
    return ad__l1(T, "ad_huber_loss", pred, target, delta);
}

/* KL divergence, PyTorch's pointwise form xlogy(t, t) - t x, summed and divided by the batch.
   Gradients: -t g / N for x; (log t + 1 - x) g / N for t, 0 where t is 0. Recorded, t's log is
   taken of t with 1 where t is 0 and the result set to 0 there, so that no 0 / 0 appears in a
   higher derivative either. */
AD__PRIVATE ad_real ad__kl_batch(const ad_tensor *x) { return x->ndim ? (ad_real)x->shape[0] : 1; }

AD__PRIVATE void ad__kl_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad_tape *T = S->T;
    ad_tensor *x = n->in[0], *t = n->in[1], *gs, *zero, *one, *is0, *safe;
    ad_real scale = 1 / ad__kl_batch(x), s, v, *d;
    size_t i;
    int add;
    if (!S->create_graph) {
        s = g->data[0] * scale;
        if (ad__wants(S, x) && (d = ad__grad_target(S, x, &add)) != NULL)
            for (i = 0; i < x->size; i++) {
                v = -t->data[i] * s;
                d[i] = add ? d[i] + v : v;
            }
        if (ad__wants(S, t) && (d = ad__grad_target(S, t, &add)) != NULL)
            for (i = 0; i < t->size; i++) {
                v = t->data[i] == 0 ? 0 : (AD__F(log)(t->data[i]) + 1 - x->data[i]) * s;
                d[i] = add ? d[i] + v : v;
            }
        return;
    }
    gs = ad_mul_scalar(T, g, scale);
    if (ad__wants(S, x)) ad__accum(S, x, ad_mul(T, ad_neg(T, t), gs), 1);
    if (!ad__wants(S, t)) return;
    is0 = ad__like(T, "ad_kl_div", t);
    zero = ad__scalar(T, "ad_kl_div", 0);
    one = ad__scalar(T, "ad_kl_div", 1);
    if (!is0) { S->failed = 1; return; }
    for (i = 0; i < t->size; i++) is0->data[i] = t->data[i] == 0;
    safe = ad_where(T, is0, one, t);
    ad__accum(S, t, ad_mul(T, ad_where(T, is0, zero, ad_sub(T, ad_add_scalar(T, ad_log(T, safe), 1), x)), gs), 1);
}

AUTODIFF_API ad_tensor *ad_kl_div(ad_tape *T, ad_tensor *logp, ad_tensor *target)
{
    double total = 0;
    size_t i;
    ad_tensor *y;
    if (!T || !logp || !target) return NULL;
    if (!ad__check_same(T, "ad_kl_div", logp, target)) return NULL;
    y = ad__tensor(T, "ad_kl_div", 0, NULL, 1);
    if (!y) return NULL;
    for (i = 0; i < logp->size; i++) {
        ad_real t = target->data[i], x = logp->data[i];
        total += (double)((t == 0 ? 0 : t * AD__F(log)(t)) - t * x);
    }
    y->data[0] = (ad_real)(total / (double)ad__kl_batch(logp));
    if (!ad__record2(T, "ad_kl_div", y, ad__kl_backward, logp, target)) return NULL;
    return y;
}

/* >>impl:custom ------------------------------------------------------------------------------ */
/* A custom op's entry keeps a copy of its descriptor (name included: the user's may be a local)
   and the bytes its forward saved for the backward. */
typedef struct ad__custom_saved {
    ad_custom_op op;
    void *bytes;
} ad__custom_saved;

/* 'ad_custom "NAME"', the prefix of every message about a custom op. */
AD__PRIVATE const char *ad__custom_who(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "ad_custom \"%s\"", name ? name : "custom");
    return buf;
}

/* Checks a gradient that a recorded backward returned for input i; records the error. */
AD__PRIVATE int ad__custom_check_grad(ad_tape *T, const char *who, const ad_tensor *x, const ad_tensor *g, int i)
{
    char a[96], b[96];
    if (!g) {
        ad__fail(T, "%s backward: the gradient of input %d is NULL (the op needs it)", who, i);
        return 0;
    }
    if (!ad__on_tape(T, who, "a gradient returned by the backward", g)) return 0;
    if (!ad__same_shape(g, x)) {
        ad__fail(T, "%s backward: the gradient of input %d has shape %s; the input has shape %s", who, i,
                 ad_shape_str(g, a, sizeof a), ad_shape_str(x, b, sizeof b));
        return 0;
    }
    return 1;
}

AD__PRIVATE void ad__custom_backward(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    ad__custom_saved *sv = (ad__custom_saved *)n->saved;
    ad_tape *T = S->T;
    ad_custom_call c;
    ad_tensor *gin[AD_CUSTOM_MAX_INPUTS];
    ad_real *arrays[AD_CUSTOM_MAX_INPUTS];
    char who[96];
    int i, rc, any = 0;
    memset(&c, 0, sizeof c);
    c.name = sv->op.name;
    c.ctx = sv->op.ctx;
    c.saved = sv->bytes;
    c.nin = n->nin;
    c.in = n->in;
    c.out = n->out;
    for (i = 0; i < n->nin; i++) {
        c.needs_grad[i] = (unsigned char)ad__wants(S, n->in[i]);
        any |= c.needs_grad[i];
        gin[i] = NULL;
        arrays[i] = NULL;
    }
    if (!any) return;
    ad__custom_who(c.name, who, sizeof who);
    if (sv->op.backward) {
        rc = sv->op.backward(T, &c, g, gin);
        if (rc) ad__fail(T, "%s backward: returned %d", who, rc);
        for (i = 0; !rc && i < n->nin; i++)
            if (c.needs_grad[i] && !ad__custom_check_grad(T, who, n->in[i], gin[i], i)) rc = -1;
        for (i = 0; !rc && i < n->nin; i++)
            if (c.needs_grad[i]) ad__accum(S, n->in[i], gin[i], 0); /* it may be g, or an input */
    } else if (S->create_graph) {
        ad__fail(T, "%s: create_graph through an op whose backward is on arrays (backward_array), "
                 "which gives first derivatives only; give it a recorded backward", who);
        rc = -1;
    } else {
        for (i = 0, rc = 0; !rc && i < n->nin; i++) {
            if (!c.needs_grad[i]) continue;
            gin[i] = ad__full(T, who, n->in[i]->ndim, n->in[i]->shape, 0);
            if (gin[i]) arrays[i] = gin[i]->data;
            else rc = -1;
        }
        if (!rc && (rc = sv->op.backward_array(&c, g->data, arrays)) != 0)
            ad__fail(T, "%s backward: returned %d", who, rc);
        for (i = 0; !rc && i < n->nin; i++)
            if (c.needs_grad[i]) ad__accum(S, n->in[i], gin[i], 1);
    }
    if (rc) S->failed = 1;
}

AUTODIFF_API ad_tensor *ad_custom(ad_tape *T, const ad_custom_op *op, int nin, ad_tensor *const *in)
{
    ad__custom_saved *sv;
    ad_custom_call c;
    ad_tensor *y;
    ad__node *node;
    char who[96], what[32];
    const char *kept_who;
    int i, rc, ndim, shape[AD_MAX_DIMS], needed = 0;
    size_t len, who_len;
    if (!T) return NULL;
    if (!op) {
        ad__fail(T, "ad_custom: op is NULL");
        return NULL;
    }
    ad__custom_who(op->name, who, sizeof who);
    if (nin < 1 || nin > AD_CUSTOM_MAX_INPUTS || !in) {
        ad__fail(T, "%s: %d inputs%s; between 1 and %d are supported", who, nin, in ? "" : " (in is NULL)",
                 AD_CUSTOM_MAX_INPUTS);
        return NULL;
    }
    for (i = 0; i < nin; i++)
        if (!in[i]) return NULL;
    for (i = 0; i < nin; i++) {
        snprintf(what, sizeof what, "input %d", i);
        if (!ad__on_tape(T, who, what, in[i])) return NULL;
        if (in[i]->requires_grad && T->grad_enabled) needed = 1;
    }
    if (!op->forward) {
        ad__fail(T, "%s: the op has no forward function", who);
        return NULL;
    }
    if (needed && !op->backward && !op->backward_array) {
        ad__fail(T, "%s: an input requires grad but the op has no backward (set backward or backward_array)", who);
        return NULL;
    }
    memset(&c, 0, sizeof c);
    c.name = op->name ? op->name : "custom";
    c.ctx = op->ctx;
    c.nin = nin;
    c.in = in;
    if (op->saved_bytes) {
        if (!(c.saved = ad__alloc(T, op->saved_bytes, who))) return NULL;
        memset(c.saved, 0, op->saved_bytes);
    }
    if (op->shape) {
        ndim = -1;
        if ((rc = op->shape(&c, &ndim, shape)) != 0) {
            ad__fail(T, "%s: the shape function returned %d", who, rc);
            return NULL;
        }
    } else {
        ndim = in[0]->ndim;
        memcpy(shape, in[0]->shape, sizeof shape);
    }
    if (!(y = ad__tensor(T, who, ndim, shape, 1))) return NULL;
    memset(y->data, 0, y->size * sizeof(ad_real));
    c.out = y;
    if ((rc = op->forward(&c)) != 0) {
        ad__fail(T, "%s: the forward returned %d", who, rc);
        return NULL;
    }
    if (!needed) return y;
    /* the name, and the op's name for messages and pictures (the entry keeps it), on the tape */
    len = strlen(c.name) + 1;
    who_len = strlen(who) + 1;
    if (!(sv = (ad__custom_saved *)ad__alloc_aligned(T, sizeof *sv + len + who_len, 16, who))) return NULL;
    sv->op = *op;
    sv->op.name = (const char *)memcpy(sv + 1, c.name, len);
    kept_who = (const char *)memcpy((char *)(sv + 1) + len, who, who_len);
    sv->bytes = c.saved;
    if (!(node = ad__record(T, kept_who, y, ad__custom_backward, in, nin))) return NULL;
    node->saved = sv;
    return y;
}

/* >>impl:gradcheck --------------------------------------------------------------------------- */
/* One check's state: f, its inputs' values (copies the checker perturbs) and their leaves on
   the checker's own tape U. */
typedef struct ad__gradcheck {
    ad_tape *U;
    ad_fn f;
    void *ctx;
    int n;
    ad_tensor *const *in;        /* the caller's tensors: shapes and which require grad */
    ad_real *data[AD_CUSTOM_MAX_INPUTS];
    ad_tensor *x[AD_CUSTOM_MAX_INPUTS];
    uint64_t seed;
} ad__gradcheck;

/* L = sum(w * f(x)) on a reset U, with the inputs as views of the copies. */
AD__PRIVATE ad_tensor *ad__gradcheck_loss(ad__gradcheck *G)
{
    ad_tensor *y, *w;
    ad_rng r;
    int i;
    ad_tape_reset(G->U);
    for (i = 0; i < G->n; i++) {
        G->x[i] = ad_tensor_view(G->U, G->in[i]->ndim, G->in[i]->shape, G->data[i], NULL,
                                 G->in[i]->requires_grad);
        if (!G->x[i]) return NULL;
    }
    if (!(y = G->f(G->U, G->x, G->ctx))) return NULL;
    ad_rng_seed(&r, G->seed);
    w = ad_rand(G->U, y->ndim, y->shape, (ad_real)0.5, (ad_real)1.5, &r);
    return ad_sum(G->U, ad_mul(G->U, y, w));
}

/* s = sum_i sum(v_i * dL/dx_i) over the inputs that require grad: its gradient is a
   Hessian-vector product. With create_graph it stays differentiable. */
AD__PRIVATE ad_tensor *ad__gradcheck_dot(ad__gradcheck *G, int create_graph)
{
    ad_tensor *loss = ad__gradcheck_loss(G), *s = NULL;
    ad_rng r;
    int i;
    if (!loss) return NULL;
    ad_rng_seed(&r, 99);
    for (i = 0; i < G->n; i++) {
        ad_tensor *g, *v, *term;
        if (!G->in[i]->requires_grad) continue;
        g = ad_grad(G->U, loss, G->x[i], create_graph);
        v = ad_rand(G->U, G->x[i]->ndim, G->x[i]->shape, (ad_real)-1, (ad_real)1, &r);
        term = ad_sum(G->U, ad_mul(G->U, g, v));
        if (!term) return NULL;
        s = s ? ad_add(G->U, s, term) : term;
    }
    return s;
}

/* The value checked at order 1 (L, nothing recorded) or 2 (s by plain sweeps); NaN with U's
   error set when f fails. */
AD__PRIVATE double ad__gradcheck_value(ad__gradcheck *G, int order)
{
    ad_tensor *v;
    if (order == 1) {
        int was = ad_set_grad_enabled(G->U, 0);
        v = ad__gradcheck_loss(G);
        ad_set_grad_enabled(G->U, was);
    } else {
        v = ad__gradcheck_dot(G, 0);
    }
    return v ? (double)v->data[0] : NAN;
}

/* The analytic derivatives of order 1 or 2 into ana (the inputs' elements one after another).
   Returns 0, or -1 with U's error set. */
AD__PRIVATE int ad__gradcheck_analytic(ad__gradcheck *G, int order, double *ana)
{
    ad_tensor *v = order == 1 ? ad__gradcheck_loss(G) : ad__gradcheck_dot(G, 1);
    size_t j, at = 0;
    int i;
    if (!v || ad_backward(G->U, v) != 0) return -1;
    for (i = 0; i < G->n; i++, at += G->in[i - 1]->size)
        for (j = 0; j < G->in[i]->size; j++) ana[at + j] = G->x[i]->grad ? (double)G->x[i]->grad[j] : 0;
    return 0;
}

/* Compares order `order` against central differences; updates res. Returns 0, or -1 when f
   failed (U's error says why). */
AD__PRIVATE int ad__gradcheck_order(ad__gradcheck *G, int order, double eps, double atol, double rtol,
                                    double *ana, ad_gradcheck_result *res)
{
    size_t j, at = 0;
    int i;
    if (ad__gradcheck_analytic(G, order, ana) != 0) return -1;
    for (i = 0; i < G->n; at += G->in[i]->size, i++) {
        if (!G->in[i]->requires_grad) continue;
        for (j = 0; j < G->in[i]->size; j++) {
            ad_real keep = G->data[i][j];
            double h = eps * (fabs((double)keep) > 1 ? fabs((double)keep) : 1), xp, xm, lp, lm, num, err, tol, ratio;
            G->data[i][j] = (ad_real)((double)keep + h);
            xp = (double)G->data[i][j];
            lp = ad__gradcheck_value(G, order);
            G->data[i][j] = (ad_real)((double)keep - h);
            xm = (double)G->data[i][j];
            lm = ad__gradcheck_value(G, order);
            G->data[i][j] = keep;
            if (lp != lp || lm != lm) {
                if (ad_tape_error(G->U)) return -1;
            }
            num = (lp - lm) / (xp - xm); /* the steps as rounded to ad_real */
            err = fabs(ana[at + j] - num);
            tol = atol + rtol * fabs(num);
            if (!(err <= tol)) res->mismatches++;
            if (err == err && tol == tol) ratio = err / tol;
            else err = ratio = HUGE_VAL; /* a NaN on either side */
            res->checked++;
            if (err > res->max_error) res->max_error = err;
            if (res->checked == 1 || ratio > res->max_ratio) {
                res->max_ratio = ratio;
                res->order = order;
                res->input = i;
                res->index = j;
                res->analytic = ana[at + j];
                res->numeric = num;
            }
        }
    }
    return 0;
}

AUTODIFF_API int ad_gradcheck(ad_tape *T, ad_fn f, void *ctx, int n, ad_tensor *const *in,
                              const ad_gradcheck_options *opt, ad_gradcheck_result *res)
{
#ifdef AUTODIFF_DOUBLE
    const double d_eps = 1e-6, d_atol = 1e-6, d_rtol = 1e-5, d_eps2 = 1e-5, d_atol2 = 1e-5, d_rtol2 = 1e-4;
#else
    const double d_eps = 1e-3, d_atol = 1e-2, d_rtol = 1e-2, d_eps2 = 1e-2, d_atol2 = 1e-2, d_rtol2 = 1e-2;
#endif
    ad_gradcheck_options o;
    ad_gradcheck_result own;
    ad__gradcheck G;
    size_t total = 0, at = 0;
    double *ana = NULL;
    ad_real *copies = NULL;
    int i, rc = 0, orders;
    char what[32];
    if (!res) res = &own;
    memset(res, 0, sizeof *res);
    res->input = -1;
    if (!T) return -1;
    if (!f || n < 1 || n > AD_CUSTOM_MAX_INPUTS || !in) {
        if (!f || !in) ad__fail(T, "ad_gradcheck: %s is NULL", f ? "in" : "f");
        else ad__fail(T, "ad_gradcheck: %d inputs; between 1 and %d are supported", n, AD_CUSTOM_MAX_INPUTS);
        return -1;
    }
    for (i = 0; i < n; i++) {
        snprintf(what, sizeof what, "input %d", i);
        if (!in[i]) {
            ad__fail(T, "ad_gradcheck: input %d is NULL (an earlier op failed)", i);
            return -1;
        }
        if (!ad__on_tape(T, "ad_gradcheck", what, in[i])) return -1;
        total += in[i]->size;
    }
    if (opt) o = *opt;
    else memset(&o, 0, sizeof o);
    orders = o.orders <= 0 ? 1 : o.orders & 3;
    if (o.eps <= 0) o.eps = d_eps;
    if (o.atol <= 0) o.atol = d_atol;
    if (o.rtol <= 0) o.rtol = d_rtol;
    if (o.eps2 <= 0) o.eps2 = d_eps2;
    if (o.atol2 <= 0) o.atol2 = d_atol2;
    if (o.rtol2 <= 0) o.rtol2 = d_rtol2;
    memset(&G, 0, sizeof G);
    G.f = f;
    G.ctx = ctx;
    G.n = n;
    G.in = in;
    G.seed = o.seed ? o.seed : 1234;
    G.U = ad_tape_new();
    ana = (double *)AUTODIFF_MALLOC(total * sizeof(double));
    copies = (ad_real *)AUTODIFF_MALLOC(total * sizeof(ad_real));
    if (!G.U || !ana || !copies) {
        ad__fail(T, "ad_gradcheck: out of memory");
        rc = -1;
    } else {
        ad_set_threads(G.U, ad_get_threads(T));
        for (i = 0; i < n; at += in[i]->size, i++) {
            G.data[i] = copies + at;
            memcpy(G.data[i], in[i]->data, in[i]->size * sizeof(ad_real));
        }
        if ((orders & 1) && ad__gradcheck_order(&G, 1, o.eps, o.atol, o.rtol, ana, res) != 0) rc = -1;
        if (!rc && (orders & 2) && ad__gradcheck_order(&G, 2, o.eps2, o.atol2, o.rtol2, ana, res) != 0) rc = -1;
        if (rc) {
            const char *e = ad_tape_error(G.U);
            ad__fail(T, "ad_gradcheck: f failed: %s", e ? e : "it returned NULL");
        }
    }
    if (!rc && res->checked == 0) {
        ad__fail(T, "ad_gradcheck: no input requires grad: nothing to check");
        rc = -1;
    }
    if (rc) {
        snprintf(res->message, sizeof res->message, "%s", ad_tape_error(T));
    } else {
        res->passed = res->mismatches == 0;
        rc = res->passed ? 0 : 1;
        snprintf(res->message, sizeof res->message,
                 "%s; worst: %s derivative, input %d [%zu]: analytic %.10g, numeric %.10g",
                 res->passed ? "passed" : "FAILED", res->order == 1 ? "first" : "second", res->input,
                 res->index, res->analytic, res->numeric);
    }
    ad_tape_free(G.U);
    AUTODIFF_FREE(ana);
    AUTODIFF_FREE(copies);
    return rc;
}

/* >>impl:params ------------------------------------------------------------------------------ */
#define AD__PARAMS_MAX (1 << 24) /* parameters in one store */

typedef struct ad__param {
    char *name;
    size_t namelen;
    size_t offset, size; /* in scalars, into the flat buffers */
    int ndim;
    int shape[AD_MAX_DIMS];
    int frozen;          /* left alone by optimizers */
    int no_decay;        /* its group has no weight decay */
    double lr_scale;     /* its group's factor on the optimizer's lr */
} ad__param;

/* bytes from AUTODIFF_MALLOC starting on an AD__ALIGN-byte boundary; *block gets what to free.
   For the parameters and the optimizers' state, which the optimizers sweep with whole vectors:
   at the C library's 16-byte alignment, how the buffers fell against the cache's 64-byte lines
   varied from one program to the next, and with it an SGD step with momentum by a third
   (bench/optim). NULL when memory runs out. */
AD__PRIVATE void *ad__malloc_aligned(size_t bytes, void **block)
{
    if (bytes > (size_t)-1 - AD__ALIGN) return NULL;
    *block = AUTODIFF_MALLOC(bytes + AD__ALIGN - 1);
    if (!*block) return NULL;
    return ad__align_up(*block);
}

struct ad_params {
    ad_real *value, *grad;       /* nscalars in use, cap allocated, both; AD__ALIGN-aligned */
    void *value_block, *grad_block; /* what value and grad lie in, to free */
    size_t nscalars, cap;
    ad__param *items;
    int n, items_cap;
    ad_rng rng;                  /* the initialisers' random numbers */
    uint64_t saves;              /* checkpoints written: part of temporary file names */
    unsigned char *extra;        /* the program's own bytes, saved with checkpoints */
    size_t extra_len;
    ad_params_grad_hook grad_hook; /* ad_params_set_grad_hook */
    void *grad_hook_ctx;
    int has_error;
    char error[320];
};

AD__PRIVATE void ad__pfail(ad_params *P, const char *fmt, ...)
{
    va_list ap;
    if (!P) return;
    va_start(ap, fmt);
    ad__record_error(&P->has_error, P->error, sizeof P->error, fmt, ap);
    va_end(ap);
}

AD__PRIVATE int ad__train_finite(double x) { return x == x && x - x == 0; }

AUTODIFF_API ad_params *ad_params_new(uint64_t seed)
{
    ad_params *P = (ad_params *)AUTODIFF_MALLOC(sizeof(ad_params));
    if (!P) return NULL;
    memset(P, 0, sizeof *P);
    ad_rng_seed(&P->rng, seed);
    return P;
}

AUTODIFF_API void ad_params_free(ad_params *P)
{
    int i;
    if (!P) return;
    for (i = 0; i < P->n; i++) AUTODIFF_FREE(P->items[i].name);
    AUTODIFF_FREE(P->items);
    AUTODIFF_FREE(P->extra);
    AUTODIFF_FREE(P->value_block);
    AUTODIFF_FREE(P->grad_block);
    AUTODIFF_FREE(P);
}

AUTODIFF_API const char *ad_params_error(const ad_params *P)
{
    if (!P) return "autodiff: no parameter store (NULL)";
    return P->has_error ? P->error : NULL;
}

AUTODIFF_API void ad_params_clear_error(ad_params *P)
{
    if (!P) return;
    P->has_error = 0;
    P->error[0] = 0;
}

AUTODIFF_API int ad_params_find(const ad_params *P, const char *name)
{
    int i;
    if (!P || !name) return -1;
    for (i = 0; i < P->n; i++)
        if (strcmp(P->items[i].name, name) == 0) return i;
    return -1;
}

/* Checks a new parameter's name and shape; on success stores its number of scalars in *size. */
AD__PRIVATE int ad__params_check(ad_params *P, const char *name, int ndim, const int *shape, size_t *size)
{
    size_t n = 1, limit = (size_t)-1 / sizeof(ad_real) - P->nscalars, len = name ? strlen(name) : 0;
    char s[96];
    int i;
    if (len == 0 || len > AD_PARAM_NAME_MAX) {
        ad__pfail(P, "ad_params_add: name \"%.40s\" is %zu bytes long; 1 to %d are allowed", name ? name : "",
                  len, AD_PARAM_NAME_MAX);
        return 0;
    }
    if (ad_params_find(P, name) >= 0) {
        ad__pfail(P, "ad_params_add: a parameter named \"%.200s\" already exists", name);
        return 0;
    }
    if (P->n >= AD__PARAMS_MAX) {
        ad__pfail(P, "ad_params_add: \"%.200s\": the store already holds %d parameters", name, P->n);
        return 0;
    }
    if (ndim < 0 || ndim > AD_MAX_DIMS || (ndim > 0 && !shape)) {
        ad__pfail(P, "ad_params_add: \"%.200s\": %d dimensions%s; 0 to %d with a shape are supported", name,
                  ndim, shape ? "" : " and no shape", AD_MAX_DIMS);
        return 0;
    }
    for (i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || n > limit / (size_t)shape[i]) {
            ad__pfail(P, "ad_params_add: \"%.200s\": shape %s: %s", name, ad__dims_str(ndim, shape, s, sizeof s),
                      shape[i] <= 0 ? "dimensions must be positive" : "too many scalars");
            return 0;
        }
        n *= (size_t)shape[i];
    }
    *size = n;
    return 1;
}

/* Checks an initialiser's kind and numbers. */
AD__PRIVATE int ad__init_check(ad_params *P, const char *op, const ad_init *init)
{
    const char *why = NULL;
    if (!init) return 1;
    if ((int)init->kind < (int)AD_INIT_ZEROS || (int)init->kind > (int)AD_INIT_KAIMING_NORMAL)
        why = "unknown kind";
    else if (!ad__train_finite(init->a) || !ad__train_finite(init->b) || !ad__train_finite(init->gain))
        why = "a, b and gain must be finite";
    else if (init->kind == AD_INIT_UNIFORM && init->a > init->b)
        why = "the low bound a is above the high bound b";
    else if (init->kind == AD_INIT_NORMAL && init->b < 0)
        why = "the standard deviation b is negative";
    else if (init->gain < 0)
        why = "the gain is negative";
    if (why) ad__pfail(P, "%s: initialiser (kind %d, a %g, b %g, gain %g): %s", op, (int)init->kind, init->a,
                       init->b, init->gain, why);
    return why == NULL;
}

/* Makes room for one more parameter of `more` scalars. */
AD__PRIVATE int ad__params_reserve(ad_params *P, size_t more)
{
    size_t limit = (size_t)-1 / sizeof(ad_real), need = P->nscalars + more, cap;
    if (P->n == P->items_cap) {
        int icap = P->items_cap ? 2 * P->items_cap : 16;
        ad__param *items = (ad__param *)AUTODIFF_REALLOC(P->items, (size_t)icap * sizeof(ad__param));
        if (!items) return 0;
        P->items = items;
        P->items_cap = icap;
    }
    if (need > P->cap) {
        ad_real *value, *grad;
        void *value_block, *grad_block;
        cap = P->cap < limit / 2 ? 2 * P->cap : limit;
        if (cap < need) cap = need;
        value = (ad_real *)ad__malloc_aligned(cap * sizeof(ad_real), &value_block);
        grad = value ? (ad_real *)ad__malloc_aligned(cap * sizeof(ad_real), &grad_block) : NULL;
        if (!grad) {
            if (value) AUTODIFF_FREE(value_block);
            return 0;
        }
        if (P->nscalars) {
            memcpy(value, P->value, P->nscalars * sizeof(ad_real));
            memcpy(grad, P->grad, P->nscalars * sizeof(ad_real));
        }
        AUTODIFF_FREE(P->value_block);
        AUTODIFF_FREE(P->grad_block);
        P->value = value;
        P->grad = grad;
        P->value_block = value_block;
        P->grad_block = grad_block;
        P->cap = cap;
    }
    return 1;
}

AUTODIFF_API int ad_params_add(ad_params *P, const char *name, int ndim, const int *shape,
                               const ad_init *init)
{
    ad__param *p;
    size_t size, len;
    char *copy;
    if (!P) return -1;
    if (!ad__params_check(P, name, ndim, shape, &size) || !ad__init_check(P, "ad_params_add", init)) return -1;
    len = strlen(name);
    copy = (char *)AUTODIFF_MALLOC(len + 1);
    if (!copy || !ad__params_reserve(P, size)) {
        AUTODIFF_FREE(copy);
        ad__pfail(P, "ad_params_add: \"%.200s\": out of memory for %zu scalars", name, size);
        return -1;
    }
    memcpy(copy, name, len + 1);
    p = &P->items[P->n];
    memset(p, 0, sizeof *p);
    p->name = copy;
    p->namelen = len;
    p->offset = P->nscalars;
    p->size = size;
    p->ndim = ndim;
    p->lr_scale = 1;
    if (ndim > 0) memcpy(p->shape, shape, (size_t)ndim * sizeof(int));
    memset(P->grad + p->offset, 0, size * sizeof(ad_real));
    P->nscalars += size;
    P->n++;
    ad_params_init(P, P->n - 1, init);
    return P->n - 1;
}

AUTODIFF_API void ad_init_fans(int ndim, const int *shape, double *fan_in, double *fan_out)
{
    double in = 1, out = 1, field = 1;
    int i;
    if (!shape) ndim = 0;
    if (ndim == 1) {
        in = out = shape[0];
    } else if (ndim == 2) {
        in = shape[0];
        out = shape[1];
    } else if (ndim >= 3) {
        for (i = 2; i < ndim; i++) field *= shape[i];
        in = shape[1] * field;
        out = shape[0] * field;
    }
    if (fan_in) *fan_in = in;
    if (fan_out) *fan_out = out;
}

AD__PRIVATE void ad__fill_uniform(ad_real *x, size_t n, double lo, double hi, ad_rng *rng)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] = (ad_real)(lo + (hi - lo) * ad_rng_uniform(rng));
}

AD__PRIVATE void ad__fill_normal(ad_real *x, size_t n, double mean, double std, ad_rng *rng)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] = (ad_real)(mean + std * ad_rng_normal(rng));
}

/* Fills a parameter's values from init (already checked). */
AD__PRIVATE void ad__init_fill(ad__param *p, ad_real *x, const ad_init *init, ad_rng *rng)
{
    double fan_in, fan_out, gain = init->gain, bound;
    size_t i;
    ad_init_fans(p->ndim, p->shape, &fan_in, &fan_out);
    switch (init->kind) {
    case AD_INIT_CONSTANT:
        for (i = 0; i < p->size; i++) x[i] = (ad_real)init->a;
        break;
    case AD_INIT_UNIFORM:
        if (init->a == 0 && init->b == 0) ad__fill_uniform(x, p->size, 0, 1, rng);
        else ad__fill_uniform(x, p->size, init->a, init->b, rng);
        break;
    case AD_INIT_NORMAL:
        ad__fill_normal(x, p->size, init->a, init->b == 0 ? 1 : init->b, rng);
        break;
    case AD_INIT_XAVIER_UNIFORM:
        bound = (gain == 0 ? 1 : gain) * sqrt(6.0 / (fan_in + fan_out));
        ad__fill_uniform(x, p->size, -bound, bound, rng);
        break;
    case AD_INIT_XAVIER_NORMAL:
        ad__fill_normal(x, p->size, 0, (gain == 0 ? 1 : gain) * sqrt(2.0 / (fan_in + fan_out)), rng);
        break;
    case AD_INIT_KAIMING_UNIFORM:
    case AD_INIT_KAIMING_NORMAL:
        if (gain == 0) gain = sqrt(2.0 / (1.0 + init->a * init->a));
        if (init->kind == AD_INIT_KAIMING_NORMAL) ad__fill_normal(x, p->size, 0, gain / sqrt(fan_in), rng);
        else ad__fill_uniform(x, p->size, -sqrt(3.0) * gain / sqrt(fan_in), sqrt(3.0) * gain / sqrt(fan_in), rng);
        break;
    default:
        memset(x, 0, p->size * sizeof(ad_real));
    }
}

AUTODIFF_API int ad_params_init(ad_params *P, int id, const ad_init *init)
{
    ad_init zeros;
    if (!P) return -1;
    if (id < 0 || id >= P->n) {
        ad__pfail(P, "ad_params_init: no parameter %d; the store has %d", id, P->n);
        return -1;
    }
    if (!ad__init_check(P, "ad_params_init", init)) return -1;
    memset(&zeros, 0, sizeof zeros);
    ad__init_fill(&P->items[id], P->value + P->items[id].offset, init ? init : &zeros, &P->rng);
    return 0;
}

AUTODIFF_API int ad_params_count(const ad_params *P) { return P ? P->n : 0; }
AUTODIFF_API size_t ad_params_scalars(const ad_params *P) { return P ? P->nscalars : 0; }
AUTODIFF_API ad_real *ad_params_values(ad_params *P) { return P && P->nscalars ? P->value : NULL; }
AUTODIFF_API ad_real *ad_params_grads(ad_params *P) { return P && P->nscalars ? P->grad : NULL; }

AUTODIFF_API ad_param_info ad_params_info(ad_params *P, int id)
{
    ad_param_info info;
    memset(&info, 0, sizeof info);
    if (P && id >= 0 && id < P->n) {
        const ad__param *p = &P->items[id];
        info.name = p->name;
        info.ndim = p->ndim;
        info.shape = p->shape;
        info.size = p->size;
        info.offset = p->offset;
        info.value = P->value + p->offset;
        info.grad = P->grad + p->offset;
    }
    return info;
}

AUTODIFF_API int ad_params_set_trainable(ad_params *P, int id, int trainable)
{
    if (!P) return -1;
    if (id < 0 || id >= P->n) {
        ad__pfail(P, "ad_params_set_trainable: no parameter %d (the store has %d)", id, P->n);
        return -1;
    }
    P->items[id].frozen = !trainable;
    return 0;
}

AUTODIFF_API int ad_params_set_group(ad_params *P, int id, double lr_scale, int weight_decay)
{
    if (!P) return -1;
    if (id < 0 || id >= P->n) {
        ad__pfail(P, "ad_params_set_group: no parameter %d (the store has %d)", id, P->n);
        return -1;
    }
    if (!ad__train_finite(lr_scale) || lr_scale < 0) {
        ad__pfail(P, "ad_params_set_group: \"%.200s\": lr_scale %g; it must be finite and >= 0", P->items[id].name,
                  lr_scale);
        return -1;
    }
    P->items[id].lr_scale = lr_scale;
    P->items[id].no_decay = !weight_decay;
    return 0;
}

AUTODIFF_API int ad_params_group(ad_params *P, int id, double *lr_scale, int *weight_decay)
{
    if (!P) return -1;
    if (id < 0 || id >= P->n) {
        ad__pfail(P, "ad_params_group: no parameter %d (the store has %d)", id, P->n);
        return -1;
    }
    if (lr_scale) *lr_scale = P->items[id].lr_scale;
    if (weight_decay) *weight_decay = !P->items[id].no_decay;
    return 0;
}

/* Loops over a whole store (zeroing gradients, optimizer steps, scaling gradients) are split over
   a tape's threads from AD__STORE_SPLIT scalars, all alike: each parameter is cut into one band
   per task, on multiples of AD__STORE_BLOCK scalars from its start, so every scalar takes the same
   path (a vector loop or its remainder) whatever the thread count. Task t then takes the rows of
   a weight that the same task multiplies when a product is split along K (ad__gemm_ksplit) and,
   near enough, the rows of its gradient that a product split by rows computes: those rows stay in
   one core's cache from one step to the next instead of crossing between cores, which on two
   threads had made the large MLP's SGD step take twice its one-thread time. */

/* The number of tasks for n scalars of work on T's threads. */
AD__PRIVATE int ad__store_tasks(ad_tape *T, size_t n)
{
    return T && n >= AD__STORE_SPLIT ? ad__thread_count(T) : 1;
}

/* Task `task`'s band [*lo, *hi) of parameter q (in scalars of the store), out of `tasks`; 0 when
   the band is empty. */
AD__PRIVATE int ad__param_band(const ad__param *q, int tasks, int task, size_t *lo, size_t *hi)
{
    size_t stretch = ad__stretch(q->size, tasks, AD__STORE_BLOCK), a = (size_t)task * stretch;
    if (a >= q->size) return 0;
    *lo = q->offset + a;
    *hi = q->offset + (q->size - a < stretch ? q->size : a + stretch);
    return 1;
}

/* Work on the scalars [lo, hi) of the store, all of parameter q. */
typedef void (*ad__band_fn)(void *ctx, const ad__param *q, size_t lo, size_t hi);

typedef struct ad__bands_job {
    const ad_params *P;
    ad__band_fn fn;
    void *ctx;
    int tasks;
} ad__bands_job;

AD__PRIVATE void ad__bands_task(void *ctx, int task, int thread)
{
    const ad__bands_job *j = (const ad__bands_job *)ctx;
    size_t lo, hi;
    int i;
    (void)thread;
    for (i = 0; i < j->P->n; i++)
        if (ad__param_band(&j->P->items[i], j->tasks, task, &lo, &hi)) j->fn(j->ctx, &j->P->items[i], lo, hi);
}

/* fn(ctx, q, lo, hi) on every parameter q of P, one band of each a thread of T (rather than the
   stretches taken as they come of ad__parallel_range); each parameter whole, on the calling
   thread alone, for T NULL or a small store. */
AD__PRIVATE void ad__store_bands(ad_tape *T, const ad_params *P, ad__band_fn fn, void *ctx)
{
    ad__bands_job job;
    job.P = P;
    job.fn = fn;
    job.ctx = ctx;
    job.tasks = ad__store_tasks(T, P->nscalars);
    if (job.tasks > 1) ad__parallel(T, ad__bands_task, &job, job.tasks);
    else ad__bands_task(&job, 0, 0);
}

/* The gradients [lo, hi) of the store ctx set to zero. */
AD__PRIVATE void ad__zero_band(void *ctx, const ad__param *q, size_t lo, size_t hi)
{
    const ad_params *P = (const ad_params *)ctx;
    (void)q;
    memset(P->grad + lo, 0, (hi - lo) * sizeof(ad_real));
}

AUTODIFF_API void ad_params_zero_grad_on(ad_params *P, ad_tape *T)
{
    if (!P || !P->nscalars) return;
    ad__store_bands(T, P, ad__zero_band, P);
}

AUTODIFF_API void ad_params_zero_grad(ad_params *P) { ad_params_zero_grad_on(P, NULL); }

AUTODIFF_API int ad_params_set_extra(ad_params *P, const void *data, size_t len)
{
    unsigned char *copy = NULL;
    if (!P) return -1;
    if (len > AD_PARAMS_EXTRA_MAX || (len && !data)) {
        ad__pfail(P, "ad_params_set_extra: %zu bytes%s; at most AD_PARAMS_EXTRA_MAX (%d) are kept", len,
                  len && !data ? " at NULL" : "", AD_PARAMS_EXTRA_MAX);
        return -1;
    }
    if (len && !(copy = (unsigned char *)AUTODIFF_MALLOC(len))) {
        ad__pfail(P, "ad_params_set_extra: out of memory for %zu bytes", len);
        return -1;
    }
    if (len) memcpy(copy, data, len);
    AUTODIFF_FREE(P->extra);
    P->extra = copy;
    P->extra_len = len;
    return 0;
}

AUTODIFF_API const void *ad_params_extra(const ad_params *P, size_t *len)
{
    if (len) *len = P ? P->extra_len : 0;
    return P ? P->extra : NULL;
}

AD__PRIVATE int ad__mark_param(ad_tape *T, ad_tensor *x, ad_params *P, int id); /* >>impl:hooks */

AUTODIFF_API ad_tensor *ad_param(ad_tape *T, ad_params *P, int id)
{
    const ad__param *p;
    ad_tensor *x;
    if (!T) return NULL;
    if (!P) {
        ad__fail(T, "ad_param: the parameter store is NULL");
        return NULL;
    }
    if (id < 0 || id >= P->n) {
        ad__fail(T, "ad_param: no parameter %d; the store has %d", id, P->n);
        return NULL;
    }
    p = &P->items[id];
    x = ad_tensor_view(T, p->ndim, p->shape, P->value + p->offset, P->grad + p->offset, 1);
    return x && ad__mark_param(T, x, P, id) ? x : NULL;
}

/* >>impl:hooks ------------------------------------------------------------------------------- */
/* What a program attaches to a tensor (a name, a hook, retain_grad) and the parameters put on
   the tape live in one list on the tape, newest first, not in the tensor's header: headers keep
   their size, and a sweep that finds the list empty with anomaly mode off runs the plain loop. */
enum { AD__MARK_NAME, AD__MARK_HOOK, AD__MARK_RETAIN, AD__MARK_PARAM };

typedef struct ad__mark {
    struct ad__mark *next;       /* the tape's list, newest first */
    struct ad__mark *chain;      /* during a sweep: x's next hook or retain mark, oldest first */
    ad_tensor *x;
    int kind;                    /* AD__MARK_... */
    int id;                      /* PARAM: the parameter's handle in the store */
    int store_hook;              /* PARAM: the store had a hook when the parameter was put on
                                    the tape; only such a store is read by a sweep, so that a
                                    store freed before the tape's reset is never touched */
    const char *name;            /* NAME: the text, on the tape; PARAM: the store's name */
    ad_grad_hook hook;           /* HOOK */
    void *ctx;                   /* HOOK: the caller's; PARAM: the store */
} ad__mark;

/* A parameter of a store with a hook, during ad_backward. */
typedef struct ad__watch_param {
    ad_params *P;
    int id;
    int left;                    /* entries still to visit that use it */
    int deferred;                /* 1: a tensor of it has a hook, so its gradient reaches the
                                    store only after the sweep */
    int done;                    /* 1: the store's hook has been called */
} ad__watch_param;

/* A sweep with hooks, retained gradients, store hooks or anomaly checks. */
typedef struct ad__watch {
    ad__mark **chain;            /* by tensor id: its first hook or retain mark, or NULL */
    int *pslot;                  /* by tensor id: 1 + its parameter's index in params, or 0 */
    ad__watch_param *params;     /* every parameter of each store with a hook (ad_backward) */
    int nparams;
    int into_leaves;             /* ad_backward: retained gradients and store hooks */
    int anomaly;
    const char *op;              /* ad_backward or ad_grad, for messages */
} ad__watch;

AD__PRIVATE ad__mark *ad__mark_new(ad_tape *T, ad_tensor *x, int kind, const char *op)
{
    ad__mark *m = (ad__mark *)ad__alloc_aligned(T, sizeof(ad__mark), 16, op);
    if (!m) return NULL;
    memset(m, 0, sizeof *m);
    m->x = x;
    m->kind = kind;
    m->next = T->marks;
    T->marks = m;
    return m;
}

AD__PRIVATE int ad__mark_param(ad_tape *T, ad_tensor *x, ad_params *P, int id)
{
    ad__mark *m = ad__mark_new(T, x, AD__MARK_PARAM, "ad_param");
    if (!m) return 0;
    m->ctx = P;
    m->id = id;
    m->store_hook = P->grad_hook != NULL;
    m->name = P->items[id].name;
    return 1;
}

/* An entry's op name. The one-element binary ops leave n->op unset, to keep the scalar path
   short; their kind says which op they are. */
AD__PRIVATE const char *ad__op_name(const ad__node *n)
{
    if (n->backward == ad__binary_backward_one) return ad__binary_names[n->st.binary.kind];
    return n->op ? n->op : "(an op)";
}

/* x's name: the last ad_set_name, else its parameter's name in its store, else NULL. */
AD__PRIVATE const char *ad__name_of(const ad_tape *T, const ad_tensor *x)
{
    const ad__mark *m;
    const char *param = NULL;
    for (m = T->marks; m; m = m->next) {
        if (m->x != x) continue;
        if (m->kind == AD__MARK_NAME) return m->name;
        if (m->kind == AD__MARK_PARAM && !param) param = m->name;
    }
    return param;
}

/* x for a message: its shape and name, as `[3], "x"`. */
AD__PRIVATE char *ad__describe(const ad_tape *T, const ad_tensor *x, char *buf, size_t cap)
{
    char s[96];
    const char *name = ad__name_of(T, x);
    ad_shape_str(x, s, sizeof s);
    if (name) snprintf(buf, cap, "%s, \"%.60s\"", s, name);
    else snprintf(buf, cap, "%s", s);
    return buf;
}

/* Whether all n values are finite. An OR of comparisons, which the compiler vectorises (a sum
   of x - x would be one long chain of dependent adds), in blocks that stop at the first bad one. */
AD__PRIVATE int ad__all_finite(const ad_real *v, size_t n)
{
#ifdef AUTODIFF_DOUBLE
    const ad_real big = DBL_MAX;
#else
    const ad_real big = FLT_MAX;
#endif
    size_t i, end;
    if (!v) return 1;
    for (i = 0; i < n; i = end) {
        int bad = 0;
        end = n - i > 1024 ? i + 1024 : n;
        for (; i < end; i++) bad |= (v[i] != v[i]) | (v[i] > big) | (v[i] < -big);
        if (bad) return 0;
    }
    return 1;
}

AD__PRIVATE const char *ad__nonfinite_kind(const ad_real *v, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (v[i] != v[i]) return "NaN";
    return "Inf";
}

/* The forward check of anomaly mode, on out, just made by op from ins (see ad__record):
   returns n, or NULL with the error set when out has a NaN or an Inf and the inputs have none. */
AD__COLD ad__node *ad__anomaly_forward(ad_tape *T, const char *op, ad_tensor *out, ad_tensor *const *ins, int nin,
                                       ad__node *n)
{
    char msg[320], d[160];
    size_t len;
    int i;
    if (T->anomaly != 1 || T->has_error) return n; /* a sweep's own ops: see ad__watched_entry */
    for (i = 0; i < nin; i++)
        if (ins[i] && !ad__all_finite(ins[i]->data, ins[i]->size)) return n;
    if (ad__all_finite(out->data, out->size)) return n;
    len = (size_t)snprintf(msg, sizeof msg, "%s forward: %s in the result (%s)", op,
                           ad__nonfinite_kind(out->data, out->size), ad_shape_str(out, d, sizeof d));
    for (i = 0; i < nin && len < sizeof msg; i++)
        if (ins[i])
            len += (size_t)snprintf(msg + len, sizeof msg - len, "%s input %d (%s)", i ? "," : " from", i,
                                    ad__describe(T, ins[i], d, sizeof d));
    ad__fail(T, "%s", msg);
    return NULL;
}

/* Runs entry n's backward with anomaly checks around it (see ad_set_detect_anomaly). */
AD__PRIVATE void ad__watched_entry(ad__sweep *S, ad__node *n, ad_tensor *g)
{
    unsigned long long bad_before = 0;
    int i, check = ad__all_finite(g->data, g->size) && ad__all_finite(n->out->data, n->out->size);
    for (i = 0; check && i < n->nin; i++)
        if (n->in[i] && !ad__all_finite(n->in[i]->data, n->in[i]->size)) check = 0;
    for (i = 0; check && i < n->nin && i < 64; i++) {
        ad_tensor *x = n->in[i], *h = x && ad__wants(S, x) ? S->gacc[x->id] : NULL;
        if (h && !ad__all_finite(h->data, h->size)) bad_before |= 1ull << i;
    }
    n->backward(S, n, g);
    for (i = 0; check && !S->failed && i < n->nin && i < 64; i++) {
        ad_tensor *x = n->in[i], *h = x && ad__wants(S, x) ? S->gacc[x->id] : NULL;
        char d[160];
        if (!h || (bad_before >> i & 1) || ad__all_finite(h->data, h->size)) continue;
        ad__fail(S->T, "%s backward: %s in the gradient of input %d (%s)", ad__op_name(n),
                 ad__nonfinite_kind(h->data, h->size), i, ad__describe(S->T, x, d, sizeof d));
        S->failed = 1;
    }
}

/* Adds g into x->grad for ad_retain_grad. */
AD__PRIVATE void ad__retain(ad__sweep *S, ad_tensor *x, const ad_tensor *g)
{
    if (!x->grad) {
        x->grad = (ad_real *)ad__alloc(S->T, x->size * sizeof(ad_real), "ad_backward");
        if (!x->grad) { S->failed = 1; return; }
        memset(x->grad, 0, x->size * sizeof(ad_real));
    }
    ad__add_into(x->grad, g->data, x->size);
}

/* Runs x's hooks on its gradient, then fills its retained gradient. Returns the gradient to
   use, or NULL when the sweep fails. */
AD__PRIVATE ad_tensor *ad__run_hooks(ad__sweep *S, ad__watch *W, ad_tensor *x)
{
    ad_tape *T = S->T;
    ad_tensor *g = S->gacc[x->id], *r;
    ad__mark *m;
    int retain = 0, had_error = T->has_error;
    char a[160], b[96];
    for (m = W->chain[x->id]; m; m = m->chain) {
        if (m->kind == AD__MARK_RETAIN) { retain = 1; continue; } /* after the hooks, as PyTorch */
        r = m->hook(T, x, g, m->ctx);
        if (T->has_error && !had_error) { S->failed = 1; return NULL; }
        if (!r) continue;
        if (r->tape != T || r->gen != T->gen || !ad__same_shape(r, x)) {
            ad__fail(T, "%s: the gradient hook of a tensor %s returned %s%s", W->op, ad__describe(T, x, a, sizeof a),
                     r->tape != T || r->gen != T->gen ? "a tensor of another tape or an earlier step; shape " : "shape ",
                     ad_shape_str(r, b, sizeof b));
            S->failed = 1;
            return NULL;
        }
        g = r;
        S->gacc[x->id] = r;
        S->owned[x->id] = 0; /* the hook's tensor: never written into */
    }
    if (retain && W->into_leaves) ad__retain(S, x, g);
    return S->failed ? NULL : g;
}

/* After entry n: a parameter whose last use this was has its final gradient. */
AD__PRIVATE void ad__params_after(ad__sweep *S, ad__watch *W, const ad__node *n)
{
    int i;
    for (i = 0; i < n->nin; i++) {
        const ad_tensor *x = n->in[i];
        ad__watch_param *p;
        if (!x || x->id >= S->n || !W->pslot[x->id]) continue;
        p = &W->params[W->pslot[x->id] - 1];
        if (--p->left == 0 && !p->deferred && !p->done) {
            p->done = 1;
            p->P->grad_hook(p->P, p->id, p->P->grad_hook_ctx);
        }
    }
}

/* Finds the stores with a hook among the parameters on the tape and lays out their parameters
   in W->params; counts each one's uses by the entries the sweep will visit. Returns 0, or -1
   when memory runs out. */
AD__PRIVATE int ad__watch_params(ad__sweep *S, ad__watch *W)
{
    ad_tape *T = S->T;
    ad__mark *m;
    ad_params **stores;
    int *base, nstores = 0, marks = 0, i, k;
    const ad__node *n;
    for (m = T->marks; m; m = m->next)
        if (m->kind == AD__MARK_PARAM && m->store_hook && ((ad_params *)m->ctx)->grad_hook) marks++;
    if (!marks) return 0;
    stores = (ad_params **)ad__alloc(T, (size_t)marks * (sizeof(ad_params *) + sizeof(int)), W->op);
    if (!stores) return -1;
    base = (int *)(stores + marks);
    for (m = T->marks; m; m = m->next) {
        ad_params *P = (ad_params *)m->ctx;
        if (m->kind != AD__MARK_PARAM || !m->store_hook || !P->grad_hook) continue;
        for (i = 0; i < nstores && stores[i] != P; i++) {}
        if (i < nstores) continue;
        stores[nstores] = P;
        base[nstores++] = W->nparams;
        W->nparams += P->n;
    }
    W->params = (ad__watch_param *)ad__alloc(T, (size_t)W->nparams * sizeof(ad__watch_param), W->op);
    if (!W->params) return -1;
    memset(W->params, 0, (size_t)W->nparams * sizeof(ad__watch_param));
    for (i = 0; i < nstores; i++)
        for (k = 0; k < stores[i]->n; k++) {
            W->params[base[i] + k].P = stores[i];
            W->params[base[i] + k].id = k;
        }
    for (m = T->marks; m; m = m->next) {
        ad_params *P = (ad_params *)m->ctx;
        if (m->kind != AD__MARK_PARAM || !m->store_hook || !P->grad_hook || m->x->id >= S->n) continue;
        for (i = 0; stores[i] != P; i++) {}
        k = base[i] + m->id;
        W->pslot[m->x->id] = k + 1;
        if (W->chain[m->x->id]) W->params[k].deferred = 1;
    }
    for (n = T->last; n; n = n->prev)
        for (i = 0; i < n->nin; i++)
            if (n->in[i] && n->in[i]->id < S->n && W->pslot[n->in[i]->id]) W->params[W->pslot[n->in[i]->id] - 1].left++;
    return 0;
}

AD__PRIVATE int ad__sweep_is_watched(const ad_tape *T, int into_leaves)
{
    const ad__mark *m;
    if (T->anomaly) return 1;
    for (m = T->marks; m; m = m->next) /* names and parameters alone need nothing */
        if (m->kind == AD__MARK_HOOK || (m->kind == AD__MARK_RETAIN && into_leaves) ||
            (m->kind == AD__MARK_PARAM && into_leaves && m->store_hook && ((ad_params *)m->ctx)->grad_hook))
            return 1;
    return 0;
}

/* The sweep of ad__sweep_run when ad__sweep_is_watched says so: the same loop, with each
   tensor's hooks before its entry, anomaly checks around each entry, and the store hooks after
   the last use of each parameter; then the leaves' hooks. Returns NULL: no entries are left
   for the plain loop. */
AD__COLD ad__node *ad__sweep_watched(ad__sweep *S, int into_leaves, const char *op)
{
    ad_tape *T = S->T;
    ad__watch *W;
    ad__mark *m;
    ad__node *n;
    int hooks = 0;
    W = (ad__watch *)ad__alloc(T, sizeof(ad__watch) + (size_t)S->n * (sizeof(ad__mark *) + sizeof(int)), op);
    if (!W) { S->failed = 1; return NULL; }
    memset(W, 0, sizeof(ad__watch) + (size_t)S->n * (sizeof(ad__mark *) + sizeof(int)));
    W->chain = (ad__mark **)(W + 1);
    W->pslot = (int *)(W->chain + S->n);
    W->into_leaves = into_leaves;
    W->anomaly = T->anomaly != 0;
    W->op = op;
    for (m = T->marks; m; m = m->next) { /* newest first, so each chain ends oldest first */
        if (m->x->id >= S->n || !(m->kind == AD__MARK_HOOK || (m->kind == AD__MARK_RETAIN && into_leaves))) continue;
        m->chain = W->chain[m->x->id];
        W->chain[m->x->id] = m;
        hooks = 1;
        /* a hooked leaf's gradient goes to its hooks before it is added into leaf->grad */
        if (!m->x->node && S->gacc[m->x->id] && S->gacc[m->x->id]->data == m->x->grad && m->x->grad) {
            S->gacc[m->x->id] = NULL;
            S->owned[m->x->id] = 0;
        }
    }
    if (into_leaves && ad__watch_params(S, W) != 0) { S->failed = 1; return NULL; }
    if (W->nparams) S->watch = W;
    if (T->anomaly) T->anomaly = 2;
    for (n = T->last; n && !S->failed; n = n->prev) {
        ad_tensor *g = S->gacc[n->out->id];
        if (g && hooks && W->chain[n->out->id]) g = ad__run_hooks(S, W, n->out);
        if (g && W->anomaly) ad__watched_entry(S, n, g);
        else if (g) n->backward(S, n, g);
        if (W->nparams && !S->failed) ad__params_after(S, W, n);
    }
    for (m = T->marks; m && !S->failed; m = m->next)
        if (!m->x->node && m->x->id < S->n && W->chain[m->x->id] == m && S->gacc[m->x->id]) ad__run_hooks(S, W, m->x);
    if (T->anomaly) T->anomaly = 1;
    return NULL;
}

/* After ad_backward has added the leaves' gradients: the store hooks not called yet. */
AD__COLD void ad__sweep_watched_end(ad__sweep *S)
{
    ad__watch *W = S->watch;
    int k;
    for (k = 0; k < W->nparams; k++) {
        ad__watch_param *p = &W->params[k];
        if (p->done) continue;
        p->done = 1;
        p->P->grad_hook(p->P, p->id, p->P->grad_hook_ctx);
    }
}

AUTODIFF_API int ad_register_hook(ad_tensor *x, ad_grad_hook hook, void *ctx)
{
    ad_tape *T;
    ad__mark *m;
    char s[96];
    if (!x) return -1;
    T = x->tape;
    if (!ad__on_tape(T, "ad_register_hook", "x", x)) return -1;
    if (!hook) {
        ad__fail(T, "ad_register_hook: hook is NULL");
        return -1;
    }
    if (!x->requires_grad) {
        ad__fail(T, "ad_register_hook: x (%s) does not require grad, so no gradient reaches it",
                 ad__describe(T, x, s, sizeof s));
        return -1;
    }
    m = ad__mark_new(T, x, AD__MARK_HOOK, "ad_register_hook");
    if (!m) return -1;
    m->hook = hook;
    m->ctx = ctx;
    return 0;
}

AUTODIFF_API int ad_retain_grad(ad_tensor *x)
{
    char s[96];
    if (!x) return -1;
    if (!ad__on_tape(x->tape, "ad_retain_grad", "x", x)) return -1;
    if (!x->requires_grad) {
        ad__fail(x->tape, "ad_retain_grad: x (%s) does not require grad, so no gradient reaches it",
                 ad__describe(x->tape, x, s, sizeof s));
        return -1;
    }
    if (!x->node) return 0; /* a leaf gets its gradient anyway */
    return ad__mark_new(x->tape, x, AD__MARK_RETAIN, "ad_retain_grad") ? 0 : -1;
}

AUTODIFF_API void ad_params_set_grad_hook(ad_params *P, ad_params_grad_hook hook, void *ctx)
{
    if (!P) return;
    P->grad_hook = hook;
    P->grad_hook_ctx = hook ? ctx : NULL;
}

AUTODIFF_API int ad_set_detect_anomaly(ad_tape *T, int on)
{
    int previous;
    if (!T) return -1;
    previous = T->anomaly != 0;
    T->anomaly = on != 0;
    return previous;
}

#define AD__NAME_MAX 255

AUTODIFF_API ad_tensor *ad_set_name(ad_tensor *x, const char *name)
{
    ad_tape *T;
    ad__mark *m;
    char *text;
    size_t len;
    if (!x) return NULL;
    T = x->tape;
    if (!ad__on_tape(T, "ad_set_name", "x", x)) return NULL;
    if (!name) {
        ad__fail(T, "ad_set_name: name is NULL");
        return NULL;
    }
    len = strlen(name);
    if (len > AD__NAME_MAX) len = AD__NAME_MAX;
    text = (char *)ad__alloc_aligned(T, len + 1, 16, "ad_set_name");
    if (!text) return NULL;
    memcpy(text, name, len);
    text[len] = 0;
    m = ad__mark_new(T, x, AD__MARK_NAME, "ad_set_name");
    if (!m) return NULL;
    m->name = text;
    return x;
}

#ifndef AUTODIFF_NO_STDIO
/* text inside a DOT string: quotes and backslashes escaped, control characters as spaces */
AD__PRIVATE void ad__dot_text(FILE *f, const char *text)
{
    for (; *text; text++) {
        unsigned char c = (unsigned char)*text;
        if (c == '"' || c == '\\') fputc('\\', f);
        fputc(c < 32 ? ' ' : c, f);
    }
}

/* One tensor of the picture: an op as a box, a leaf as an ellipse. */
AD__PRIVATE void ad__dot_tensor(FILE *f, const ad_tensor *t, const char *name, int param, int is_y)
{
    char s[96];
    ad_shape_str(t, s, sizeof s);
    fprintf(f, "  t%u [", t->id);
    if (t->node) {
        fprintf(f, "shape=box, style=rounded, label=\"");
        ad__dot_text(f, ad__op_name(t->node));
        fprintf(f, "\\n%s", s);
        if (name) {
            fprintf(f, "\\n");
            ad__dot_text(f, name);
        }
    } else {
        fprintf(f, "shape=ellipse%s, label=\"", param ? ", style=filled, fillcolor=\"#cfe2f3\""
                                                : t->requires_grad ? ", style=filled, fillcolor=\"#d9ead3\"" : "");
        if (name) ad__dot_text(f, name);
        else if (t->size == 1 && !t->requires_grad && t->data) fprintf(f, "%g", (double)t->data[0]);
        else fprintf(f, "%s", t->requires_grad ? "leaf" : "constant");
        fprintf(f, "\\n%s", s);
    }
    fprintf(f, "\"%s];\n", is_y ? ", peripheries=2" : "");
}
#endif

AUTODIFF_API int ad_tape_write_dot(ad_tape *T, const ad_tensor *y, const char *path)
{
#ifdef AUTODIFF_NO_STDIO
    (void)y;
    (void)path;
    ad__fail(T, "ad_tape_write_dot: this build has no file functions (AUTODIFF_NO_STDIO)");
    return -1;
#else
    const ad_tensor **stack;
    const char **names;
    unsigned char *flags; /* by tensor id: 1 drawn or queued, 2 a parameter */
    const ad__mark *m;
    size_t nt, top = 0, bytes;
    FILE *f;
    int i, failed;
    if (!T) return -1;
    if (!y) {
        ad__fail(T, "ad_tape_write_dot: y is NULL (an earlier op failed)");
        return -1;
    }
    if (!ad__on_tape(T, "ad_tape_write_dot", "y", y)) return -1;
    if (!path) {
        ad__fail(T, "ad_tape_write_dot: path is NULL");
        return -1;
    }
    nt = T->ntensors;
    bytes = nt * (sizeof(*stack) + sizeof(*names) + 1);
    stack = (const ad_tensor **)AUTODIFF_MALLOC(bytes);
    if (!stack) {
        ad__fail(T, "ad_tape_write_dot: out of memory allocating %zu bytes", bytes);
        return -1;
    }
    names = (const char **)(stack + nt);
    flags = (unsigned char *)(names + nt);
    memset(names, 0, nt * sizeof(*names));
    memset(flags, 0, nt);
    for (m = T->marks; m; m = m->next)
        if (m->kind == AD__MARK_NAME && !names[m->x->id]) names[m->x->id] = m->name;
    for (m = T->marks; m; m = m->next)
        if (m->kind == AD__MARK_PARAM) {
            flags[m->x->id] |= 2;
            if (!names[m->x->id]) names[m->x->id] = m->name;
        }
    f = fopen(path, "w");
    if (!f) {
        ad__fail(T, "ad_tape_write_dot: cannot open \"%.200s\" for writing: %s", path, strerror(errno));
        AUTODIFF_FREE(stack);
        return -1;
    }
    fprintf(f, "digraph autodiff {\n  node [fontname=\"Helvetica\", fontsize=10];\n  edge [arrowsize=0.6];\n");
    stack[top++] = y;
    flags[y->id] |= 1;
    while (top > 0) { /* each tensor once: drawn, then its inputs queued */
        const ad_tensor *t = stack[--top];
        ad__dot_tensor(f, t, names[t->id], flags[t->id] & 2, t == y);
        if (!t->node) continue;
        for (i = 0; i < t->node->nin; i++) {
            const ad_tensor *x = t->node->in[i];
            if (!x) continue;
            fprintf(f, "  t%u -> t%u;\n", x->id, t->id);
            if (!(flags[x->id] & 1)) {
                flags[x->id] |= 1;
                stack[top++] = x;
            }
        }
    }
    fprintf(f, "}\n");
    failed = ferror(f) != 0;
    if (fclose(f) != 0) failed = 1;
    AUTODIFF_FREE(stack);
    if (failed) {
        ad__fail(T, "ad_tape_write_dot: writing \"%.200s\" failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
#endif
}
#undef AD__NAME_MAX

/* >>impl:optim ------------------------------------------------------------------------------- */
struct ad_optim {
    ad_params *P;
    ad_optim_desc d;      /* the settings, defaults filled in */
    uint64_t steps;
    size_t n;             /* scalars of the store the state was made for */
    int nbuf;             /* state buffers: SGD 0, or 1 with momentum; Adam, AdamW 2 (m, v);
                             RMSprop 1 (v), + 1 with momentum, + 1 centered; Adagrad 1 */
    size_t stride;        /* values from one buffer's start to the next's: n rounded up to
                             AD__ALIGN bytes, so that every buffer starts on a line */
    ad_real *state;       /* nbuf buffers of n values, zero at the start (Adagrad's: its
                             initial value); AD__ALIGN-aligned */
    void *state_block;    /* what state lies in, to free */
    double correct1;      /* Adam's bias corrections at the current step t: 1 - beta1^t */
    double correct2;      /* and sqrt(1 - beta2^t) */
};

/* The settings with every zero field replaced by its default. */
AD__PRIVATE ad_optim_desc ad__optim_defaults(const ad_optim_desc *desc)
{
    ad_optim_desc d;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.lr == 0) d.lr = d.kind == AD_OPTIM_RMSPROP || d.kind == AD_OPTIM_ADAGRAD ? 1e-2 : 1e-3;
    if (d.kind == AD_OPTIM_ADAM || d.kind == AD_OPTIM_ADAMW) {
        if (d.beta1 == 0) d.beta1 = 0.9;
        if (d.beta2 == 0) d.beta2 = 0.999;
        if (d.kind == AD_OPTIM_ADAMW && d.weight_decay == 0) d.weight_decay = 1e-2;
    }
    if (d.kind != AD_OPTIM_SGD && d.eps == 0) d.eps = d.kind == AD_OPTIM_ADAGRAD ? 1e-10 : 1e-8;
    if (d.kind == AD_OPTIM_RMSPROP && d.alpha == 0) d.alpha = 0.99;
    return d;
}

/* Why the settings (defaults filled in) cannot be used by their kind of optimizer, or NULL. */
AD__PRIVATE const char *ad__optim_invalid_for_kind(const ad_optim_desc *d)
{
    if ((int)d->kind < (int)AD_OPTIM_SGD || (int)d->kind > (int)AD_OPTIM_ADAGRAD) return "unknown optimizer kind";
    if (!ad__train_finite(d->lr) || d->lr < 0) return "lr must be finite and >= 0";
    if (!ad__train_finite(d->weight_decay) || d->weight_decay < 0) return "weight_decay must be finite and >= 0";
    if (d->kind == AD_OPTIM_SGD) {
        if (!ad__train_finite(d->momentum) || d->momentum < 0) return "momentum must be finite and >= 0";
        if (!ad__train_finite(d->dampening)) return "dampening must be finite";
        if (d->nesterov && (d->momentum <= 0 || d->dampening != 0))
            return "Nesterov momentum needs momentum > 0 and dampening 0";
        return NULL;
    }
    if ((d->kind == AD_OPTIM_ADAM || d->kind == AD_OPTIM_ADAMW) &&
        (!(d->beta1 >= 0 && d->beta1 < 1) || !(d->beta2 >= 0 && d->beta2 < 1)))
        return "beta1 and beta2 must lie in [0, 1)";
    if (d->kind == AD_OPTIM_RMSPROP) {
        if (!ad__train_finite(d->momentum) || d->momentum < 0) return "momentum must be finite and >= 0";
        if (!ad__train_finite(d->alpha) || d->alpha < 0) return "alpha must be finite and >= 0";
    }
    if (d->kind == AD_OPTIM_ADAGRAD) {
        if (!ad__train_finite(d->lr_decay) || d->lr_decay < 0) return "lr_decay must be finite and >= 0";
        if (!ad__train_finite(d->initial_accumulator_value) || d->initial_accumulator_value < 0)
            return "initial_accumulator_value must be finite and >= 0";
    }
    if (!ad__train_finite(d->eps) || d->eps <= 0) return "eps must be finite and > 0";
    return NULL;
}

/* Why the settings (defaults filled in) cannot be used, or NULL when they can: those of the
   kind, and every number finite, used or not (a checkpoint stores them all). */
AD__PRIVATE const char *ad__optim_invalid(const ad_optim_desc *d)
{
    const char *why = ad__optim_invalid_for_kind(d);
    if (!why && !(ad__train_finite(d->momentum) && ad__train_finite(d->dampening) && ad__train_finite(d->beta1) &&
                  ad__train_finite(d->beta2) && ad__train_finite(d->eps) && ad__train_finite(d->alpha) &&
                  ad__train_finite(d->lr_decay) && ad__train_finite(d->initial_accumulator_value)))
        why = "momentum, dampening, beta1, beta2, eps, alpha, lr_decay and initial_accumulator_value must be "
              "finite, even where unused";
    return why;
}

/* The most state buffers an optimizer has (centered RMSprop with momentum). */
#define AD__OPTIM_MAX_BUFFERS 3

AD__PRIVATE int ad__optim_buffers(const ad_optim_desc *d)
{
    switch (d->kind) {
    case AD_OPTIM_SGD: return d->momentum != 0;
    case AD_OPTIM_RMSPROP: return 1 + (d->momentum != 0) + (d->centered != 0);
    case AD_OPTIM_ADAGRAD: return 1;
    default: return 2;
    }
}

AUTODIFF_API ad_optim *ad_optim_new(ad_params *P, const ad_optim_desc *desc)
{
    ad_optim_desc d = ad__optim_defaults(desc);
    const char *why = ad__optim_invalid(&d);
    ad_optim *O;
    size_t bytes, stride;
    int nbuf = ad__optim_buffers(&d);
    if (!P) return NULL;
    if (why) {
        ad__pfail(P, "ad_optim_new: %s", why);
        return NULL;
    }
    if (P->nscalars > (size_t)-1 / sizeof(ad_real) / AD__OPTIM_MAX_BUFFERS - AD__ALIGN) {
        ad__pfail(P, "ad_optim_new: %zu scalars are too many for the optimizer's state", P->nscalars);
        return NULL;
    }
    stride = ad__whole_lines(P->nscalars);
    bytes = (size_t)nbuf * stride * sizeof(ad_real);
    O = (ad_optim *)AUTODIFF_MALLOC(sizeof(ad_optim));
    if (O) O->state = (ad_real *)ad__malloc_aligned(bytes ? bytes : 1, &O->state_block);
    if (!O || !O->state) {
        if (O) AUTODIFF_FREE(O);
        ad__pfail(P, "ad_optim_new: out of memory for %zu bytes of state", bytes);
        return NULL;
    }
    memset(O->state, 0, bytes);
    if (d.kind == AD_OPTIM_ADAGRAD) {
        ad_real start = (ad_real)d.initial_accumulator_value;
        size_t i;
        for (i = 0; i < P->nscalars; i++) O->state[i] = start;
    }
    O->P = P;
    O->d = d;
    O->steps = 0;
    O->correct1 = O->correct2 = 1;
    O->n = P->nscalars;
    O->stride = stride;
    O->nbuf = nbuf;
    return O;
}

AUTODIFF_API void ad_optim_free(ad_optim *O)
{
    if (!O) return;
    AUTODIFF_FREE(O->state_block);
    AUTODIFF_FREE(O);
}

/* SGD as torch.optim.SGD: d = g + wd p; with momentum b = d at the first step, then
   b = mu b + (1 - dampening) d, and d = d + mu b (Nesterov) or d = b; finally p -= lr d.
   The branches are folded into coefficients (0 or 1) so that the loop has none. */
/* One step over the scalars [lo, lo + n) of the store, whose group gives the learning rate lr
   and the weight decay wd; the compiler vectorises its loops, at the width of the instruction
   set of the function it is inlined into. With zero set, each gradient is zeroed as soon as it
   is read: one pass over the gradients instead of two. */
AD__HOT void ad__sgd_kernel(ad_optim *O, size_t lo, size_t n, int zero, double lr_run, double wd_run)
{
    const ad_optim_desc *d = &O->d;
    ad_real *AD__RESTRICT p = O->P->value + lo, *AD__RESTRICT b = O->state + lo, *AD__RESTRICT g = O->P->grad + lo;
    ad_real lr = (ad_real)lr_run, wd = (ad_real)wd_run, mu = (ad_real)d->momentum;
    ad_real keep = O->steps == 1 ? 0 : mu, take = O->steps == 1 ? 1 : (ad_real)(1 - d->dampening);
    ad_real from_d = d->nesterov ? 1 : 0, from_b = d->nesterov ? mu : 1;
    size_t i;
    if (O->nbuf == 0 && zero) {
        for (i = 0; i < n; i++) {
            p[i] -= lr * (g[i] + wd * p[i]);
            g[i] = 0;
        }
    } else if (O->nbuf == 0) {
        for (i = 0; i < n; i++) p[i] -= lr * (g[i] + wd * p[i]);
    } else if (zero) {
        for (i = 0; i < n; i++) {
            ad_real di = g[i] + wd * p[i];
            g[i] = 0;
            b[i] = keep * b[i] + take * di;
            p[i] -= lr * (from_d * di + from_b * b[i]);
        }
    } else {
        for (i = 0; i < n; i++) {
            ad_real di = g[i] + wd * p[i];
            b[i] = keep * b[i] + take * di;
            p[i] -= lr * (from_d * di + from_b * b[i]);
        }
    }
}

/* Adam and AdamW as torch.optim.Adam / AdamW at step t: Adam d = g + wd p, AdamW d = g and
   p *= 1 - lr wd; m = b1 m + (1 - b1) d; v = b2 v + (1 - b2) d^2;
   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
typedef struct ad__adam_coefs {
    ad_real l2;             /* Adam's weight decay, added to the gradient; 0 for AdamW */
    ad_real shrink;         /* AdamW's decay, 1 - lr wd, applied to p; 1 for Adam */
    ad_real b1, c1, b2, c2; /* beta1, 1 - beta1, beta2, 1 - beta2 */
    ad_real step, root;     /* lr / (1 - beta1^t) and sqrt(1 - beta2^t) */
    ad_real eps;
} ad__adam_coefs;

/* The coefficients of a run whose group gives the learning rate lr and the weight decay wd. */
AD__PRIVATE ad__adam_coefs ad__adam_coefs_of(const ad_optim *O, double lr, double wd)
{
    const ad_optim_desc *d = &O->d;
    int decoupled = d->kind == AD_OPTIM_ADAMW;
    ad__adam_coefs c;
    c.l2 = (ad_real)(decoupled ? 0 : wd);
    c.shrink = (ad_real)(decoupled ? 1 - lr * wd : 1);
    c.b1 = (ad_real)d->beta1;
    c.c1 = (ad_real)(1 - d->beta1);
    c.b2 = (ad_real)d->beta2;
    c.c2 = (ad_real)(1 - d->beta2);
    c.step = (ad_real)(lr / O->correct1);
    c.root = (ad_real)O->correct2;
    c.eps = (ad_real)d->eps;
    return c;
}

/* Adam over n scalars, one at a time: the portable kernel, and the tail of the vector one. */
AD__HOT void ad__adam_scalars(const ad__adam_coefs *c, ad_real *AD__RESTRICT p, ad_real *AD__RESTRICT m,
                              ad_real *AD__RESTRICT v, const ad_real *AD__RESTRICT g, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        ad_real di = g[i] + c->l2 * p[i];
        m[i] = c->b1 * m[i] + c->c1 * di;
        v[i] = c->b2 * v[i] + c->c2 * di * di;
        p[i] = c->shrink * p[i] - c->step * (m[i] / (AD__F(sqrt)(v[i]) / c->root + c->eps));
    }
}

/* RMSprop as torch.optim.RMSprop: d = g + wd p; v = alpha v + (1 - alpha) d^2; centered:
   a = alpha a + (1 - alpha) d and avg = sqrt(v - a^2) + eps, else avg = sqrt(v) + eps; with
   momentum b = mu b + d / avg and p -= lr b, else p -= lr d / avg. Each product and quotient is
   taken in PyTorch's order (its addcmul and addcdiv), so float results round as its do. */
typedef struct ad__rmsprop_coefs {
    ad_real l2;   /* weight decay, added to the gradient */
    ad_real a, c; /* alpha, 1 - alpha */
    ad_real mu;   /* momentum, used with a buffer */
    ad_real lr, eps;
} ad__rmsprop_coefs;

/* RMSprop over n scalars, one at a time; b (momentum) and ga (centered) may be NULL. */
AD__HOT void ad__rmsprop_scalars(const ad__rmsprop_coefs *c, ad_real *AD__RESTRICT p, ad_real *AD__RESTRICT v,
                                 ad_real *AD__RESTRICT b, ad_real *AD__RESTRICT ga, const ad_real *AD__RESTRICT g,
                                 size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        ad_real di = g[i] + c->l2 * p[i], avg;
        v[i] = c->a * v[i] + c->c * di * di;
        if (ga) {
            ga[i] = c->a * ga[i] + c->c * di;
            avg = AD__F(sqrt)(v[i] - ga[i] * ga[i]) + c->eps;
        } else {
            avg = AD__F(sqrt)(v[i]) + c->eps;
        }
        if (b) {
            b[i] = c->mu * b[i] + di / avg;
            p[i] = p[i] - c->lr * b[i];
        } else {
            p[i] = p[i] - c->lr * di / avg;
        }
    }
}

/* Adagrad as torch.optim.Adagrad at step t: d = g + wd p; s = s + d^2;
   p -= clr d / (sqrt(s) + eps) with clr = lr / (1 + (t - 1) lr_decay). */
typedef struct ad__adagrad_coefs {
    ad_real l2;  /* weight decay, added to the gradient */
    ad_real clr; /* the step's learning rate */
    ad_real eps;
} ad__adagrad_coefs;

AD__HOT void ad__adagrad_scalars(const ad__adagrad_coefs *c, ad_real *AD__RESTRICT p, ad_real *AD__RESTRICT s,
                                 const ad_real *AD__RESTRICT g, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        ad_real di = g[i] + c->l2 * p[i];
        s[i] = s[i] + di * di;
        p[i] = p[i] - c->clr * di / (AD__F(sqrt)(s[i]) + c->eps);
    }
}

#if AD__X86_DISPATCH
/* The optimizer's loops at the width of AVX-512 and of AVX2, chosen at run time like the GEMM
   kernels. SGD's loops are vectorised by the compiler. Adam's cannot be: sqrt may set errno,
   so compilers keep it a scalar call unless told -fno-math-errno. Its AVX2 kernel therefore
   spells out its vectors and takes the square roots with the vector instruction (AVX's sqrtps,
   sqrtpd). Square roots and quotients are correctly rounded, so the two kernels differ from
   the portable one only where the compiler fuses a multiply and an add. */
static __attribute__((target("avx512f,avx2,fma"))) AD__UNUSED void ad__sgd_avx512(ad_optim *O, size_t lo, size_t n,
                                                                                  int zero, double lr, double wd)
{
    ad__sgd_kernel(O, lo, n, zero, lr, wd);
}

static __attribute__((target("avx2,fma"))) AD__UNUSED void ad__sgd_avx2(ad_optim *O, size_t lo, size_t n, int zero,
                                                                        double lr, double wd)
{
    ad__sgd_kernel(O, lo, n, zero, lr, wd);
}

typedef ad_real ad__adam_vec __attribute__((vector_size(32)));
#ifdef AUTODIFF_DOUBLE
#define AD__VEC_SQRT_256 __builtin_ia32_sqrtpd256
#else
#define AD__VEC_SQRT_256 __builtin_ia32_sqrtps256
#endif

static __attribute__((target("avx2,fma"))) AD__UNUSED void
ad__adam_avx2(const ad__adam_coefs *c, ad_real *AD__RESTRICT p, ad_real *AD__RESTRICT m, ad_real *AD__RESTRICT v,
              const ad_real *AD__RESTRICT g, size_t n)
{
    enum { VL = (int)(32 / sizeof(ad_real)) };
    ad__adam_vec pv, mv, vv, gv, di;
    size_t i;
    for (i = 0; i + VL <= n; i += VL) {
        memcpy(&pv, p + i, sizeof pv);
        memcpy(&mv, m + i, sizeof mv);
        memcpy(&vv, v + i, sizeof vv);
        memcpy(&gv, g + i, sizeof gv);
        di = gv + c->l2 * pv;
        mv = c->b1 * mv + c->c1 * di;
        vv = c->b2 * vv + c->c2 * di * di;
        pv = c->shrink * pv - c->step * (mv / (AD__VEC_SQRT_256(vv) / c->root + c->eps));
        memcpy(p + i, &pv, sizeof pv);
        memcpy(m + i, &mv, sizeof mv);
        memcpy(v + i, &vv, sizeof vv);
    }
    ad__adam_scalars(c, p + i, m + i, v + i, g + i, n - i);
}

/* RMSprop and Adagrad the same way: their vectors spelled out, their roots and quotients
   correctly rounded vector instructions. */
static __attribute__((target("avx2,fma"))) AD__UNUSED void
ad__rmsprop_avx2(const ad__rmsprop_coefs *c, ad_real *AD__RESTRICT p, ad_real *AD__RESTRICT v,
                 ad_real *AD__RESTRICT b, ad_real *AD__RESTRICT ga, const ad_real *AD__RESTRICT g, size_t n)
{
    enum { VL = (int)(32 / sizeof(ad_real)) };
    ad__adam_vec pv, vv, bv, av, gv, di, avg;
    size_t i;
    for (i = 0; i + VL <= n; i += VL) {
        memcpy(&pv, p + i, sizeof pv);
        memcpy(&vv, v + i, sizeof vv);
        memcpy(&gv, g + i, sizeof gv);
        di = gv + c->l2 * pv;
        vv = c->a * vv + c->c * di * di;
        memcpy(v + i, &vv, sizeof vv);
        if (ga) {
            memcpy(&av, ga + i, sizeof av);
            av = c->a * av + c->c * di;
            memcpy(ga + i, &av, sizeof av);
            avg = AD__VEC_SQRT_256(vv - av * av) + c->eps;
        } else {
            avg = AD__VEC_SQRT_256(vv) + c->eps;
        }
        if (b) {
            memcpy(&bv, b + i, sizeof bv);
            bv = c->mu * bv + di / avg;
            memcpy(b + i, &bv, sizeof bv);
            pv = pv - c->lr * bv;
        } else {
            pv = pv - c->lr * di / avg;
        }
        memcpy(p + i, &pv, sizeof pv);
    }
    ad__rmsprop_scalars(c, p + i, v + i, b ? b + i : NULL, ga ? ga + i : NULL, g + i, n - i);
}

static __attribute__((target("avx2,fma"))) AD__UNUSED void
ad__adagrad_avx2(const ad__adagrad_coefs *c, ad_real *AD__RESTRICT p, ad_real *AD__RESTRICT s,
                 const ad_real *AD__RESTRICT g, size_t n)
{
    enum { VL = (int)(32 / sizeof(ad_real)) };
    ad__adam_vec pv, sv, gv, di;
    size_t i;
    for (i = 0; i + VL <= n; i += VL) {
        memcpy(&pv, p + i, sizeof pv);
        memcpy(&sv, s + i, sizeof sv);
        memcpy(&gv, g + i, sizeof gv);
        di = gv + c->l2 * pv;
        sv = sv + di * di;
        pv = pv - c->clr * di / (AD__VEC_SQRT_256(sv) + c->eps);
        memcpy(p + i, &pv, sizeof pv);
        memcpy(s + i, &sv, sizeof sv);
    }
    ad__adagrad_scalars(c, p + i, s + i, g + i, n - i);
}
#endif

/* One SGD step over the scalars [lo, lo + n) of the store, with the machine's widest vectors;
   zero: the gradients are zeroed as they are read. lr and wd: see ad__sgd_kernel. */
AD__PRIVATE void ad__sgd_step(ad_optim *O, size_t lo, size_t n, int zero, double lr, double wd)
{
#if AD__X86_DISPATCH
    if (ad__isa() == AD__ISA_AVX512) {
        ad__sgd_avx512(O, lo, n, zero, lr, wd);
        return;
    }
    if (ad__isa() == AD__ISA_AVX2) {
        ad__sgd_avx2(O, lo, n, zero, lr, wd);
        return;
    }
#endif
    ad__sgd_kernel(O, lo, n, zero, lr, wd);
}

/* One Adam or AdamW step over the scalars [lo, lo + n) of the store, of a group with learning
   rate lr and weight decay wd. */
AD__PRIVATE void ad__adam_step(ad_optim *O, size_t lo, size_t n, double lr, double wd)
{
    ad__adam_coefs c = ad__adam_coefs_of(O, lr, wd);
    ad_real *p = O->P->value + lo, *m = O->state + lo, *v = O->state + O->stride + lo;
    const ad_real *g = O->P->grad + lo;
#if AD__X86_DISPATCH
    if (ad__isa() >= AD__ISA_AVX2) {
        ad__adam_avx2(&c, p, m, v, g, n);
        return;
    }
#endif
    ad__adam_scalars(&c, p, m, v, g, n);
}

/* One RMSprop step over the scalars [lo, lo + n) of the store, the same way. Its buffers: v,
   then the momentum buffer when momentum is on, then the mean of g when centered. */
AD__PRIVATE void ad__rmsprop_step(ad_optim *O, size_t lo, size_t n, double lr, double wd)
{
    const ad_optim_desc *d = &O->d;
    ad__rmsprop_coefs c;
    ad_real *p = O->P->value + lo, *v = O->state + lo, *next = v + O->stride, *b = NULL, *ga = NULL;
    const ad_real *g = O->P->grad + lo;
    if (d->momentum != 0) {
        b = next;
        next += O->stride;
    }
    if (d->centered) ga = next;
    c.l2 = (ad_real)wd;
    c.a = (ad_real)d->alpha;
    c.c = (ad_real)(1 - d->alpha);
    c.mu = (ad_real)d->momentum;
    c.lr = (ad_real)lr;
    c.eps = (ad_real)d->eps;
#if AD__X86_DISPATCH
    if (ad__isa() >= AD__ISA_AVX2) {
        ad__rmsprop_avx2(&c, p, v, b, ga, g, n);
        return;
    }
#endif
    ad__rmsprop_scalars(&c, p, v, b, ga, g, n);
}

/* One Adagrad step over the scalars [lo, lo + n) of the store, the same way. */
AD__PRIVATE void ad__adagrad_step(ad_optim *O, size_t lo, size_t n, double lr, double wd)
{
    ad__adagrad_coefs c;
    ad_real *p = O->P->value + lo, *s = O->state + lo;
    const ad_real *g = O->P->grad + lo;
    c.l2 = (ad_real)wd;
    c.clr = (ad_real)(lr / (1 + (double)(O->steps - 1) * O->d.lr_decay));
    c.eps = (ad_real)O->d.eps;
#if AD__X86_DISPATCH
    if (ad__isa() >= AD__ISA_AVX2) {
        ad__adagrad_avx2(&c, p, s, g, n);
        return;
    }
#endif
    ad__adagrad_scalars(&c, p, s, g, n);
}

/* The gradients of frozen parameters, which an optimizer step does not visit, set to zero. */
AD__PRIVATE void ad__zero_frozen_grads(ad_params *P)
{
    int i;
    for (i = 0; i < P->n; i++)
        if (P->items[i].frozen) memset(P->grad + P->items[i].offset, 0, P->items[i].size * sizeof(ad_real));
}

/* With zero_grad, Adam updates the scalars in pieces of AD__ZERO_PIECE (a multiple of
   AD__STORE_BLOCK, so every scalar still takes the same path), each piece's gradients zeroed
   right after its update while they are still in the first-level cache. SGD zeroes each
   gradient in its own loop, as it reads it. */

/* Updates the scalars [lo, lo + n) of the store, which belong to parameters of group's group. */
AD__PRIVATE void ad__optim_update(ad_optim *O, size_t lo, size_t n, const ad__param *group)
{
    size_t piece = O->d.zero_grad ? AD__ZERO_PIECE : n, at, len;
    double lr = O->d.lr * group->lr_scale, wd = group->no_decay ? 0 : O->d.weight_decay;
    if (O->d.kind == AD_OPTIM_SGD) {
        ad__sgd_step(O, lo, n, O->d.zero_grad, lr, wd);
        return;
    }
    for (at = 0; at < n; at += len) {
        len = n - at < piece ? n - at : piece;
        if (O->d.kind == AD_OPTIM_RMSPROP) ad__rmsprop_step(O, lo + at, len, lr, wd);
        else if (O->d.kind == AD_OPTIM_ADAGRAD) ad__adagrad_step(O, lo + at, len, lr, wd);
        else ad__adam_step(O, lo + at, len, lr, wd);
        if (O->d.zero_grad) memset(O->P->grad + lo + at, 0, len * sizeof(ad_real));
    }
}

/* Updates the band [lo, hi) of parameter q for the optimizer ctx; frozen parameters are left
   alone. */
AD__PRIVATE void ad__optim_band(void *ctx, const ad__param *q, size_t lo, size_t hi)
{
    if (!q->frozen) ad__optim_update((ad_optim *)ctx, lo, hi - lo, q);
}

AUTODIFF_API int ad_optim_step_on(ad_optim *O, ad_tape *T)
{
    if (!O) return -1;
    if (O->P->nscalars != O->n) {
        ad__pfail(O->P, "%s: the store has %zu scalars, the optimizer was made for %zu; make the "
                  "optimizer after adding every parameter", T ? "ad_optim_step_on" : "ad_optim_step", O->P->nscalars,
                  O->n);
        return -1;
    }
    O->steps++;
    O->correct1 = 1 - pow(O->d.beta1, (double)O->steps);
    O->correct2 = sqrt(1 - pow(O->d.beta2, (double)O->steps));
    ad__store_bands(T, O->P, ad__optim_band, O);
    if (O->d.zero_grad) ad__zero_frozen_grads(O->P);
    return 0;
}

AUTODIFF_API int ad_optim_step(ad_optim *O) { return ad_optim_step_on(O, NULL); }

AUTODIFF_API void ad_optim_set_lr(ad_optim *O, double lr)
{
    if (!O) return;
    if (!ad__train_finite(lr) || lr < 0) ad__pfail(O->P, "ad_optim_set_lr: lr %g; it must be finite and >= 0", lr);
    else O->d.lr = lr;
}

AUTODIFF_API double ad_optim_lr(const ad_optim *O) { return O ? O->d.lr : 0; }
AUTODIFF_API uint64_t ad_optim_steps(const ad_optim *O) { return O ? O->steps : 0; }

AUTODIFF_API ad_optim_desc ad_optim_settings(const ad_optim *O)
{
    ad_optim_desc d;
    if (O) return O->d;
    memset(&d, 0, sizeof d);
    return d;
}

/* The sum of the squares of v[0..n) in double, in eight running sums so that the adds do not
   wait on each other (one running sum took twice as long over a GPT's 800,000 gradients),
   combined in a fixed order. */
AD__INLINE double ad__sum_squares(const ad_real *v, size_t n)
{
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t j, k;
    for (j = 0; j + 8 <= n; j += 8)
        for (k = 0; k < 8; k++) part[k] += (double)v[j + k] * (double)v[j + k];
    for (; j < n; j++) part[0] += (double)v[j] * (double)v[j];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/* The gradient norm's sum of squares is taken in chunks whose length depends on the store's
   size alone (as ad__reduce_sum_split cuts a sum of everything), each chunk's in ad__sum_squares,
   and the chunks' sums are added in order: threads take chunks, and the norm is the same for
   any thread count. */
typedef struct ad__clip_job {
    ad_real *g;
    size_t n, chunk;
    double *part;    /* each chunk's sum of squares */
    ad_real scale;   /* what the gradients are multiplied by */
} ad__clip_job;

AD__INLINE void ad__clip_sum_chunks(const ad__clip_job *j, size_t lo, size_t hi)
{
    size_t c;
    for (c = lo; c < hi; c++) {
        size_t at = c * j->chunk;
        j->part[c] = ad__sum_squares(j->g + at, j->n - at < j->chunk ? j->n - at : j->chunk);
    }
}

AD__PRIVATE void ad__clip_sum_range(const void *ctx, size_t lo, size_t hi)
{
    ad__clip_sum_chunks((const ad__clip_job *)ctx, lo, hi);
}

#if AD__X86_DISPATCH
/* The same sums at AVX2's width: each of the eight running sums is a lane, so the bits are the
   portable loop's (without FMA, which would round a double's product and sum once); 2.2x as
   fast over a GPT's 804,096 gradients in cache. */
static __attribute__((target("avx2"))) AD__UNUSED void ad__clip_sum_range_avx2(const void *ctx, size_t lo, size_t hi)
{
    ad__clip_sum_chunks((const ad__clip_job *)ctx, lo, hi);
}
#endif

/* The chunks' sums of squares for the machine's vectors. */
AD__INLINE ad__range_fn ad__clip_sum_kernel(void)
{
#if AD__X86_DISPATCH
    if (ad__isa() >= AD__ISA_AVX2) return ad__clip_sum_range_avx2;
#endif
    return ad__clip_sum_range;
}

AD__PRIVATE void ad__clip_scale_band(void *ctx, const ad__param *q, size_t lo, size_t hi)
{
    const ad__clip_job *j = (const ad__clip_job *)ctx;
    ad_real *AD__RESTRICT g = j->g, c = j->scale;
    size_t i;
    (void)q;
    for (i = lo; i < hi; i++) g[i] *= c;
}

AD__PRIVATE double ad__clip_grad_norm(ad_params *P, double max_norm, ad_tape *T, const char *op)
{
    double part[AD__SUM_CHUNKS], sum = 0, norm, coef;
    ad__clip_job job;
    size_t chunks, c;
    if (!P) return -1;
    if (!(max_norm >= 0)) {
        ad__pfail(P, "%s: max_norm is %g; it must be >= 0", op, max_norm);
        return -1;
    }
    job.g = P->grad;
    job.n = P->nscalars;
    job.part = part;
    job.chunk = ad__sum_chunk_length(job.n);
    chunks = (job.n + job.chunk - 1) / job.chunk;
    if (ad__store_tasks(T, job.n) > 1) ad__parallel_range(T, ad__clip_sum_kernel(), &job, chunks, 2, 1);
    else ad__clip_sum_kernel()(&job, 0, chunks);
    for (c = 0; c < chunks; c++) sum += part[c];
    norm = sqrt(sum);
    coef = max_norm / (norm + 1e-6);
    if (ad__train_finite(norm) && coef < 1) {
        job.scale = (ad_real)coef;
        ad__store_bands(T, P, ad__clip_scale_band, &job);
    }
    return norm;
}

AUTODIFF_API double ad_clip_grad_norm(ad_params *P, double max_norm)
{
    return ad__clip_grad_norm(P, max_norm, NULL, "ad_clip_grad_norm");
}

AUTODIFF_API double ad_clip_grad_norm_on(ad_params *P, double max_norm, ad_tape *T)
{
    return ad__clip_grad_norm(P, max_norm, T, "ad_clip_grad_norm_on");
}

AUTODIFF_API double ad_lr_step_decay(double lr0, int64_t step_size, double gamma, int64_t epoch)
{
    if (step_size <= 0 || epoch <= 0) return lr0;
    return lr0 * pow(gamma, (double)(epoch / step_size));
}

AUTODIFF_API double ad_lr_cosine(double lr0, double min_lr, int64_t warmup_steps, int64_t total_steps,
                                 int64_t step)
{
    double t;
    if (step < 0) step = 0;
    if (step < warmup_steps) return lr0 * (double)(step + 1) / (double)warmup_steps;
    if (step >= total_steps) return min_lr;
    t = (double)(step - warmup_steps) / (double)(total_steps - warmup_steps);
    return min_lr + (lr0 - min_lr) * 0.5 * (1 + cos(3.14159265358979323846 * t));
}

/* L-BFGS, a port of torch.optim.LBFGS (its step, _strong_wolfe and _cubic_interpolate) that
   keeps its order of operations: vectors of n scalars (the whole store; frozen parameters'
   gradients read as 0, so their components of every direction are 0 and they never move) in
   ad_real, scalars (losses, dot products, steps) in double. */
struct ad_lbfgs {
    ad_params *P;
    ad_lbfgs_desc d;      /* the settings, defaults filled in */
    size_t n;             /* scalars of the store it was made for */
    int64_t iterations;   /* PyTorch's state n_iter */
    int64_t evaluations;  /* and func_evals */
    ad_real *x;           /* the parameters where the present iteration started */
    ad_real *dir;         /* d, the direction */
    ad_real *g;           /* flat_grad, the gradient at the present point */
    ad_real *g_prev;      /* prev_flat_grad */
    ad_real *ls;          /* the line search's four gradients (g_new, g_prev, the bracket's two) */
    ad_real **hist;       /* history pairs, oldest first: hist[k] holds y, then s (2n values) */
    ad_real *spare;       /* a pair's room for the next y and s, or NULL */
    double *ro, *al;      /* 1 / (y . s) of each pair; the two-loop recursion's alphas */
    int nhist;            /* pairs held, up to history_size */
    double t, H_diag, prev_loss;
};

AD__PRIVATE ad_lbfgs_desc ad__lbfgs_defaults(const ad_lbfgs_desc *desc)
{
    ad_lbfgs_desc d;
    if (desc) d = *desc;
    else memset(&d, 0, sizeof d);
    if (d.lr == 0) d.lr = 1;
    if (d.max_iter == 0) d.max_iter = 20;
    if (d.max_eval == 0) d.max_eval = d.max_iter > INT_MAX / 5 ? INT_MAX / 4 : d.max_iter * 5 / 4;
    if (d.tolerance_grad == 0) d.tolerance_grad = 1e-7;
    if (d.tolerance_change == 0) d.tolerance_change = 1e-9;
    if (d.history_size == 0) d.history_size = 100;
    return d;
}

AD__PRIVATE const char *ad__lbfgs_invalid(const ad_lbfgs_desc *d)
{
    if (!ad__train_finite(d->lr) || d->lr < 0) return "lr must be finite and >= 0";
    if (d->max_iter < 0 || d->max_eval < 0) return "max_iter and max_eval must be >= 0";
    if (!ad__train_finite(d->tolerance_grad) || d->tolerance_grad < 0 || !ad__train_finite(d->tolerance_change) ||
        d->tolerance_change < 0)
        return "tolerance_grad and tolerance_change must be finite and >= 0";
    if (d->history_size < 0) return "history_size must be >= 0";
    if ((int)d->line_search < (int)AD_LINE_SEARCH_NONE || (int)d->line_search > (int)AD_LINE_SEARCH_STRONG_WOLFE)
        return "unknown line search";
    return NULL;
}

AUTODIFF_API ad_lbfgs *ad_lbfgs_new(ad_params *P, const ad_lbfgs_desc *desc)
{
    ad_lbfgs_desc d = ad__lbfgs_defaults(desc);
    const char *why = ad__lbfgs_invalid(&d);
    size_t vectors = d.line_search == AD_LINE_SEARCH_STRONG_WOLFE ? 8 : 4, n, h;
    ad_lbfgs *L;
    if (!P) return NULL;
    if (why) {
        ad__pfail(P, "ad_lbfgs_new: %s", why);
        return NULL;
    }
    n = P->nscalars ? P->nscalars : 1;
    h = (size_t)d.history_size;
    if (n > (size_t)-1 / sizeof(ad_real) / 8 || h > (size_t)-1 / sizeof(double) / 4) {
        ad__pfail(P, "ad_lbfgs_new: %zu scalars and %zu history pairs are too many", P->nscalars, h);
        return NULL;
    }
    L = (ad_lbfgs *)AUTODIFF_MALLOC(sizeof(ad_lbfgs));
    if (L) {
        memset(L, 0, sizeof *L);
        L->x = (ad_real *)AUTODIFF_MALLOC(vectors * n * sizeof(ad_real));
        L->hist = (ad_real **)AUTODIFF_MALLOC((h ? h : 1) * sizeof(ad_real *));
        L->ro = (double *)AUTODIFF_MALLOC((h ? 2 * h : 1) * sizeof(double));
    }
    if (!L || !L->x || !L->hist || !L->ro) {
        if (L) {
            AUTODIFF_FREE(L->x);
            AUTODIFF_FREE(L->hist);
            AUTODIFF_FREE(L->ro);
            AUTODIFF_FREE(L);
        }
        ad__pfail(P, "ad_lbfgs_new: out of memory for %zu scalars", vectors * n);
        return NULL;
    }
    L->P = P;
    L->d = d;
    L->n = P->nscalars;
    L->dir = L->x + n;
    L->g = L->dir + n;
    L->g_prev = L->g + n;
    L->ls = vectors > 4 ? L->g_prev + n : NULL;
    L->al = L->ro + h;
    L->H_diag = 1;
    return L;
}

AUTODIFF_API void ad_lbfgs_free(ad_lbfgs *L)
{
    int k;
    if (!L) return;
    for (k = 0; k < L->nhist; k++) AUTODIFF_FREE(L->hist[k]);
    AUTODIFF_FREE(L->spare);
    AUTODIFF_FREE(L->hist);
    AUTODIFF_FREE(L->ro);
    AUTODIFF_FREE(L->x);
    AUTODIFF_FREE(L);
}

AUTODIFF_API ad_lbfgs_desc ad_lbfgs_settings(const ad_lbfgs *L)
{
    ad_lbfgs_desc d;
    if (L) return L->d;
    memset(&d, 0, sizeof d);
    return d;
}

AUTODIFF_API int64_t ad_lbfgs_iterations(const ad_lbfgs *L) { return L ? L->iterations : 0; }
AUTODIFF_API int64_t ad_lbfgs_evaluations(const ad_lbfgs *L) { return L ? L->evaluations : 0; }

AD__PRIVATE double ad__lbfgs_dot(const ad_real *a, const ad_real *b, size_t n)
{
    double s = 0;
    size_t i;
    for (i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

AD__PRIVATE double ad__lbfgs_max_abs(const ad_real *a, size_t n)
{
    double m = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        double v = AD__F(fabs)(a[i]);
        if (v > m || v != v) m = v;
    }
    return m;
}

/* The trained parameters set to base + t dir (PyTorch's _add_grad from base); frozen ones, whose
   direction is 0, are left alone. */
AD__PRIVATE void ad__lbfgs_move(ad_lbfgs *L, const ad_real *base, double t)
{
    ad_params *P = L->P;
    ad_real tr = (ad_real)t;
    size_t i;
    int k;
    for (k = 0; k < P->n; k++) {
        const ad__param *q = &P->items[k];
        if (q->frozen) continue;
        for (i = q->offset; i < q->offset + q->size; i++) P->value[i] = base[i] + tr * L->dir[i];
    }
}

/* One call of the closure on a reset tape with zeroed gradients; its gradient goes into g
   (frozen parameters' as 0). Returns the loss, or NaN with the store's error set. */
AD__PRIVATE double ad__lbfgs_eval(ad_lbfgs *L, ad_tape *T, ad_closure closure, void *ctx, ad_real *g)
{
    ad_params *P = L->P;
    double f;
    int k;
    ad_params_zero_grad_on(P, T);
    ad_tape_reset(T);
    f = closure(T, ctx);
    if (f != f) {
        const char *terr = ad_tape_error(T);
        ad__pfail(P, "ad_lbfgs_step: the closure returned NaN (evaluation %lld)%s%.200s", (long long)L->evaluations + 1,
                  terr ? "; the tape's error: " : "", terr ? terr : "");
        return f;
    }
    L->evaluations++;
    for (k = 0; k < P->n; k++) {
        const ad__param *q = &P->items[k];
        if (q->frozen) memset(g + q->offset, 0, q->size * sizeof(ad_real));
        else memcpy(g + q->offset, P->grad + q->offset, q->size * sizeof(ad_real));
    }
    /* a NaN or infinite gradient would carry into every later direction and parameter */
    if (!ad__train_finite(ad__lbfgs_max_abs(g, L->n))) {
        ad__pfail(P, "ad_lbfgs_step: the gradient at evaluation %lld is not finite (loss %g)",
                  (long long)L->evaluations, f);
        return NAN;
    }
    return f;
}

/* _cubic_interpolate: the minimiser of the cubic through (x1, f1) and (x2, f2) with slopes g1
   and g2, clamped to bounds (NULL: the interval between x1 and x2), or the bounds' midpoint
   when the cubic has none. The clamps compare as Python's max and min do. A loss of +Inf (a
   trial step too long for the model, exp overflowing) makes the minimiser NaN, which PyTorch
   would step to; the midpoint instead halves the bracket, so the search backs off. */
AD__PRIVATE double ad__cubic_interpolate(double x1, double f1, double g1, double x2, double f2, double g2,
                                         const double *bounds)
{
    double lo = bounds ? bounds[0] : x1 <= x2 ? x1 : x2, hi = bounds ? bounds[1] : x1 <= x2 ? x2 : x1;
    double d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2), d2_square = d1 * d1 - g1 * g2, d2, min_pos;
    if (d2_square >= 0) {
        d2 = sqrt(d2_square);
        if (x1 <= x2) min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2));
        else min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2));
        if (lo > min_pos) min_pos = lo;
        if (hi < min_pos) min_pos = hi;
        if (min_pos == min_pos) return min_pos;
    }
    return (lo + hi) / 2.; /* also where an infinite loss made the cubic NaN (PyTorch's NaN) */
}

/* One evaluation of the line search at x + t d; the parameters go back to x afterwards. */
AD__PRIVATE double ad__lbfgs_try(ad_lbfgs *L, ad_tape *T, ad_closure closure, void *ctx, double t, ad_real *g)
{
    double f;
    ad__lbfgs_move(L, L->x, t);
    f = ad__lbfgs_eval(L, T, closure, ctx, g);
    memcpy(L->P->value, L->x, L->n * sizeof(ad_real));
    return f;
}

/* _strong_wolfe from x (L->x) along d with first trial t, loss f, gradient L->g and directional
   derivative gtd, with PyTorch's c1 1e-4, c2 0.9, tolerance_change 1e-9 (its default, which
   LBFGS does not pass on) and max_ls 25. Sets *t, *f and L->g to the point found; returns the
   number of evaluations, or -1 when the closure failed. */
AD__PRIVATE int ad__strong_wolfe(ad_lbfgs *L, ad_tape *T, ad_closure closure, void *ctx, double *t_io, double *f_io,
                                 double gtd)
{
    const double c1 = 1e-4, c2 = 0.9, tolerance_change = 1e-9;
    const int max_ls = 25;
    size_t n = L->n;
    ad_real *g = L->g, *g_new = L->ls, *g_prev_buf = g_new + n, *bg[2];
    const ad_real *g_prev = g;
    double t = *t_io, f = *f_io, d_norm = ad__lbfgs_max_abs(L->dir, n), f_new, gtd_new, t_prev = 0, f_prev = f;
    double gtd_prev = gtd, bracket[2], bracket_f[2], bracket_gtd[2] = {0, 0}, bounds[2], tmp, eps;
    int evals = 1, ls_iter = 0, done = 0, nbracket = 0, low, high, insuf_progress = 0;
    bg[0] = g_prev_buf + n;
    bg[1] = bg[0] + n;
    f_new = ad__lbfgs_try(L, T, closure, ctx, t, g_new);
    if (f_new != f_new) return -1;
    gtd_new = ad__lbfgs_dot(g_new, L->dir, n);
    while (ls_iter < max_ls) {
        int above = f_new > (f + c1 * t * gtd) || (ls_iter > 1 && f_new >= f_prev);
        if (!above && fabs(gtd_new) <= -c2 * gtd) {
            bracket[0] = t;
            bracket_f[0] = f_new;
            memcpy(bg[0], g_new, n * sizeof(ad_real));
            nbracket = 1;
            done = 1;
            break;
        }
        if (above || gtd_new >= 0) { /* a bracket: above the Armijo line, or past the minimum */
            bracket[0] = t_prev, bracket[1] = t;
            bracket_f[0] = f_prev, bracket_f[1] = f_new;
            bracket_gtd[0] = gtd_prev, bracket_gtd[1] = gtd_new;
            memcpy(bg[0], g_prev, n * sizeof(ad_real));
            memcpy(bg[1], g_new, n * sizeof(ad_real));
            nbracket = 2;
            break;
        }
        bounds[0] = t + 0.01 * (t - t_prev); /* interpolate */
        bounds[1] = t * 10;
        tmp = t;
        t = ad__cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds);
        t_prev = tmp; /* next step */
        f_prev = f_new;
        memcpy(g_prev_buf, g_new, n * sizeof(ad_real));
        g_prev = g_prev_buf;
        gtd_prev = gtd_new;
        f_new = ad__lbfgs_try(L, T, closure, ctx, t, g_new);
        evals++;
        if (f_new != f_new) return -1;
        gtd_new = ad__lbfgs_dot(g_new, L->dir, n);
        ls_iter++;
    }
    if (ls_iter == max_ls) { /* reached the most evaluations */
        bracket[0] = 0, bracket[1] = t;
        bracket_f[0] = f, bracket_f[1] = f_new;
        memcpy(bg[0], g, n * sizeof(ad_real));
        memcpy(bg[1], g_new, n * sizeof(ad_real));
        nbracket = 2;
    }
    /* zoom: refine the bracket until a point meets the conditions */
    low = bracket_f[0] <= bracket_f[nbracket - 1] ? 0 : 1;
    high = 1 - low;
    while (!done && ls_iter < max_ls) {
        double bmax = bracket[1] > bracket[0] ? bracket[1] : bracket[0];
        double bmin = bracket[1] < bracket[0] ? bracket[1] : bracket[0];
        if (fabs(bracket[1] - bracket[0]) * d_norm < tolerance_change) break;
        t = ad__cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1],
                                  NULL);
        /* a trial close to an end of the bracket after one without progress, or outside it, is
           moved a tenth of the bracket inside */
        eps = 0.1 * (bmax - bmin);
        if ((t - bmin < bmax - t ? t - bmin : bmax - t) < eps) {
            if (insuf_progress || t >= bmax || t <= bmin) {
                if (fabs(t - bmax) < fabs(t - bmin)) t = bmax - eps;
                else t = bmin + eps;
                insuf_progress = 0;
            } else {
                insuf_progress = 1;
            }
        } else {
            insuf_progress = 0;
        }
        f_new = ad__lbfgs_try(L, T, closure, ctx, t, g_new);
        evals++;
        if (f_new != f_new) return -1;
        gtd_new = ad__lbfgs_dot(g_new, L->dir, n);
        ls_iter++;
        if (f_new > (f + c1 * t * gtd) || f_new >= bracket_f[low]) {
            /* Armijo's condition fails, or no lower than the lowest point */
            bracket[high] = t;
            bracket_f[high] = f_new;
            memcpy(bg[high], g_new, n * sizeof(ad_real));
            bracket_gtd[high] = gtd_new;
            low = bracket_f[0] <= bracket_f[1] ? 0 : 1;
            high = 1 - low;
        } else {
            if (fabs(gtd_new) <= -c2 * gtd) {
                done = 1; /* the Wolfe conditions hold */
            } else if (gtd_new * (bracket[high] - bracket[low]) >= 0) {
                ad_real *swap = bg[high]; /* the old high becomes the new low */
                bracket[high] = bracket[low];
                bracket_f[high] = bracket_f[low];
                bg[high] = bg[low];
                bg[low] = swap;
                bracket_gtd[high] = bracket_gtd[low];
            }
            bracket[low] = t; /* the new point becomes the new low */
            bracket_f[low] = f_new;
            memcpy(bg[low], g_new, n * sizeof(ad_real));
            bracket_gtd[low] = gtd_new;
        }
    }
    *t_io = bracket[low];
    *f_io = bracket_f[low];
    memcpy(g, bg[low], n * sizeof(ad_real));
    return evals;
}

/* The L-BFGS direction into dir: the two-loop recursion over the history from -g. */
AD__PRIVATE void ad__lbfgs_direction(ad_lbfgs *L)
{
    size_t n = L->n, i;
    ad_real *q = L->dir, hd = (ad_real)L->H_diag;
    int k;
    for (i = 0; i < n; i++) q[i] = -L->g[i];
    for (k = L->nhist - 1; k >= 0; k--) {
        const ad_real *y = L->hist[k], *s = y + n;
        ad_real a;
        L->al[k] = ad__lbfgs_dot(s, q, n) * L->ro[k];
        a = (ad_real)-L->al[k];
        for (i = 0; i < n; i++) q[i] += a * y[i];
    }
    for (i = 0; i < n; i++) q[i] *= hd; /* times the initial Hessian: r, the direction */
    for (k = 0; k < L->nhist; k++) {
        const ad_real *y = L->hist[k], *s = y + n;
        double be = ad__lbfgs_dot(y, q, n) * L->ro[k];
        ad_real a = (ad_real)(L->al[k] - be);
        for (i = 0; i < n; i++) q[i] += a * s[i];
    }
}

/* The history update of an iteration after the first: y = g - g_prev and s = t d become the
   newest pair when y . s > 1e-10 (the oldest goes when history_size are held). Returns 0, or -1
   when memory ran out (the history then stays as it was). */
AD__PRIVATE int ad__lbfgs_update(ad_lbfgs *L)
{
    size_t n = L->n, i;
    ad_real *y, *s, tr = (ad_real)L->t;
    double ys;
    int k;
    if (!L->spare && !(L->spare = (ad_real *)AUTODIFF_MALLOC(2 * (n ? n : 1) * sizeof(ad_real)))) {
        ad__pfail(L->P, "ad_lbfgs_step: out of memory for a history pair of %zu scalars", 2 * n);
        return -1;
    }
    y = L->spare;
    s = y + n;
    for (i = 0; i < n; i++) {
        y[i] = L->g[i] - L->g_prev[i];
        s[i] = L->dir[i] * tr;
    }
    ys = ad__lbfgs_dot(y, s, n);
    if (ys > 1e-10) {
        if (L->nhist == L->d.history_size) { /* the oldest pair makes room */
            ad_real *oldest = L->hist[0];
            for (k = 1; k < L->nhist; k++) {
                L->hist[k - 1] = L->hist[k];
                L->ro[k - 1] = L->ro[k];
            }
            L->nhist--;
            L->spare = oldest;
        } else {
            L->spare = NULL;
        }
        L->hist[L->nhist] = y;
        L->ro[L->nhist] = 1. / ys;
        L->nhist++;
        L->H_diag = ys / ad__lbfgs_dot(y, y, n);
    }
    return 0;
}

AUTODIFF_API double ad_lbfgs_step(ad_lbfgs *L, ad_tape *T, ad_closure closure, void *ctx)
{
    ad_params *P;
    double orig_loss, loss, gtd, sum;
    size_t n, i;
    int n_iter = 0, current_evals = 1, ls_evals, opt_cond;
    if (!L) return NAN;
    P = L->P;
    n = L->n;
    if (P->nscalars != L->n) {
        ad__pfail(P, "ad_lbfgs_step: the store has %zu scalars, L-BFGS was made for %zu; make it after adding every "
                  "parameter", P->nscalars, L->n);
        return NAN;
    }
    if (!T || !closure) {
        ad__pfail(P, "ad_lbfgs_step: %s is NULL", !T ? "the tape" : "the closure");
        return NAN;
    }
    orig_loss = loss = ad__lbfgs_eval(L, T, closure, ctx, L->g);
    if (loss != loss) return loss;
    opt_cond = ad__lbfgs_max_abs(L->g, n) <= L->d.tolerance_grad;
    if (opt_cond) return orig_loss;
    while (n_iter < L->d.max_iter) {
        if (L->iterations > 0 && ad__lbfgs_update(L) != 0) return NAN;
        n_iter++;
        L->iterations++;
        /* the direction: steepest descent at the very first iteration, then L-BFGS's */
        if (L->iterations == 1) {
            for (i = 0; i < n; i++) L->dir[i] = -L->g[i];
            L->H_diag = 1;
        } else {
            ad__lbfgs_direction(L);
        }
        memcpy(L->g_prev, L->g, n * sizeof(ad_real));
        L->prev_loss = loss;
        /* the step length: a first guess */
        if (L->iterations == 1) {
            for (i = 0, sum = 0; i < n; i++) sum += AD__F(fabs)(L->g[i]);
            sum = 1. / sum;
            L->t = (sum < 1. ? sum : 1.) * L->d.lr; /* Python's min(1., 1. / sum) */
        } else {
            L->t = L->d.lr;
        }
        gtd = ad__lbfgs_dot(L->g, L->dir, n);
        if (gtd > -L->d.tolerance_change) break; /* the directional derivative is below tolerance */
        memcpy(L->x, P->value, n * sizeof(ad_real));
        ls_evals = 0;
        if (L->d.line_search == AD_LINE_SEARCH_STRONG_WOLFE) {
            ls_evals = ad__strong_wolfe(L, T, closure, ctx, &L->t, &loss, gtd);
            if (ls_evals < 0) return NAN;
            ad__lbfgs_move(L, L->x, L->t);
            opt_cond = ad__lbfgs_max_abs(L->g, n) <= L->d.tolerance_grad;
        } else {
            ad__lbfgs_move(L, L->x, L->t);
            if (n_iter != L->d.max_iter) { /* no evaluation after the last iteration */
                loss = ad__lbfgs_eval(L, T, closure, ctx, L->g);
                if (loss != loss) {
                    memcpy(P->value, L->x, n * sizeof(ad_real));
                    return NAN;
                }
                opt_cond = ad__lbfgs_max_abs(L->g, n) <= L->d.tolerance_grad;
                ls_evals = 1;
            }
        }
        current_evals += ls_evals;
        /* the conditions to stop */
        if (n_iter == L->d.max_iter || current_evals >= L->d.max_eval || opt_cond) break;
        for (i = 0, sum = 0; i < n; i++) { /* lack of progress: max |d t| */
            double v = fabs((double)(L->dir[i] * (ad_real)L->t));
            if (v > sum) sum = v;
        }
        if (sum <= L->d.tolerance_change) break;
        if (fabs(loss - L->prev_loss) < L->d.tolerance_change) break;
    }
    return orig_loss;
}

/* >>impl:checkpoint ---------------------------------------------------------------------------
   Checkpoint format, version 3. Integers and values are little-endian; values are IEEE-754.
       offset  bytes  field
       0       8      magic 89 41 44 43 4B 0D 0A 1A ("\x89ADCK\r\n\x1a": text-mode copies break it)
       8       4      u32 format version: 3
       12      4      u32 element type: 4 = float32, 8 = float64 (its size in bytes)
       16      8      u64 length of the whole file in bytes, checksum included
       24      4      u32 number of parameters
       28      4      u32 optimizer: 0 none, 1 SGD, 2 Adam, 3 AdamW, 4 RMSprop, 5 Adagrad
       32             per parameter, in the store's order: u32 name length (1..AD_PARAM_NAME_MAX),
                      the name's bytes (no terminator), u32 ndim, ndim x u32 dimensions, u32 flags
                      (bit 0: frozen; bit 1: no weight decay; the other bits 0), f64 lr scale
                      (finite, >= 0)
       then           the values of every parameter in the same order (the store's flat buffer)
       then           when the optimizer field is not 0: u64 step count; f64 lr, momentum,
                      dampening, weight_decay, beta1, beta2, eps; u32 nesterov (0 or 1); u32
                      zero_grad (0 or 1); f64 alpha, lr_decay, initial_accumulator_value; u32
                      centered (0 or 1); u32 number of state buffers (SGD: 1 with momentum, else
                      0; Adam, AdamW: 2, m then v; RMSprop: v, then the momentum buffer with
                      momentum, then the mean gradient when centered; Adagrad: 1, the sums of
                      squares); then each buffer, as many values as the parameters have scalars
       then           u64 length of the program's extra bytes (ad_params_set_extra), the bytes
       last    8      u64 FNV-1a 64-bit hash of every byte before it
   Versions 1 and 2 are still read. Version 2 has no lr scales, no flag but bit 0, optimizers 0
   to 3 only, and none of alpha, lr_decay, initial_accumulator_value and centered; version 1,
   besides, no flags at all, no zero_grad field and no extra bytes.
   The loader checks magic, version, element type, length and hash, then walks the structure
   against the store with bounds checks on every read; it writes nothing until all of it passed. */
#define AD__CKPT_HEADER 32
#define AD__CKPT_OPTIM_V1 (8 + 7 * 8 + 4 + 4)
#define AD__CKPT_OPTIM_V2 (AD__CKPT_OPTIM_V1 + 4)
#define AD__CKPT_OPTIM (AD__CKPT_OPTIM_V2 + 3 * 8 + 4)
#define AD__CKPT_VERSION 3
#define AD__CKPT_FROZEN 1u
#define AD__CKPT_NO_DECAY 2u

static const unsigned char ad__ckpt_magic[8] = {0x89, 'A', 'D', 'C', 'K', '\r', '\n', 0x1a};

AD__PRIVATE unsigned char *ad__ckpt_put32(unsigned char *p, uint32_t x)
{
    int i;
    for (i = 0; i < 4; i++) p[i] = (unsigned char)(x >> (8 * i));
    return p + 4;
}

AD__PRIVATE unsigned char *ad__ckpt_put64(unsigned char *p, uint64_t x)
{
    int i;
    for (i = 0; i < 8; i++) p[i] = (unsigned char)(x >> (8 * i));
    return p + 8;
}

AD__PRIVATE unsigned char *ad__ckpt_putf64(unsigned char *p, double x)
{
    uint64_t u;
    memcpy(&u, &x, 8);
    return ad__ckpt_put64(p, u);
}

AD__PRIVATE uint32_t ad__ckpt_get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

AD__PRIVATE uint64_t ad__ckpt_get64(const unsigned char *p)
{
    return (uint64_t)ad__ckpt_get32(p) | (uint64_t)ad__ckpt_get32(p + 4) << 32;
}

AD__PRIVATE double ad__ckpt_getf64(const unsigned char *p)
{
    uint64_t u = ad__ckpt_get64(p);
    double x;
    memcpy(&x, &u, 8);
    return x;
}

AD__PRIVATE unsigned char *ad__ckpt_put_reals(unsigned char *p, const ad_real *x, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++, p += sizeof(ad_real)) {
#ifdef AUTODIFF_DOUBLE
        ad__ckpt_putf64(p, x[i]);
#else
        uint32_t u;
        memcpy(&u, &x[i], 4);
        ad__ckpt_put32(p, u);
#endif
    }
    return p;
}

AD__PRIVATE void ad__ckpt_get_reals(ad_real *x, const unsigned char *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++, p += sizeof(ad_real)) {
#ifdef AUTODIFF_DOUBLE
        x[i] = ad__ckpt_getf64(p);
#else
        uint32_t u = ad__ckpt_get32(p);
        memcpy(&x[i], &u, 4);
#endif
    }
}

AD__PRIVATE uint64_t ad__ckpt_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

AD__PRIVATE size_t ad__ckpt_add(size_t a, size_t b) { return a > (size_t)-1 - b ? (size_t)-1 : a + b; }

/* Bytes of a checkpoint of P with nbuf optimizer state buffers (nbuf < 0: no optimizer) and
   extra bytes of the program's, or 0 when that does not fit in a size_t. */
AD__PRIVATE size_t ad__ckpt_bytes(const ad_params *P, int nbuf, size_t extra)
{
    size_t total = AD__CKPT_HEADER + 8 + 8, values = P->nscalars * sizeof(ad_real);
    int i;
    for (i = 0; i < P->n; i++) total = ad__ckpt_add(total, 20 + P->items[i].namelen + 4 * (size_t)P->items[i].ndim);
    total = ad__ckpt_add(total, values);
    if (nbuf >= 0) total = ad__ckpt_add(total, AD__CKPT_OPTIM);
    for (i = 0; i < nbuf; i++) total = ad__ckpt_add(total, values);
    total = ad__ckpt_add(total, extra);
    return total == (size_t)-1 ? 0 : total;
}

/* Writes the checkpoint of P and O (may be NULL), len bytes as ad__ckpt_bytes computed. */
AD__PRIVATE void ad__ckpt_write(unsigned char *buf, size_t len, const ad_params *P, const ad_optim *O)
{
    unsigned char *p = buf;
    int i, k;
    memcpy(p, ad__ckpt_magic, 8);
    p = ad__ckpt_put32(p + 8, AD__CKPT_VERSION);
    p = ad__ckpt_put32(p, (uint32_t)sizeof(ad_real));
    p = ad__ckpt_put64(p, (uint64_t)len);
    p = ad__ckpt_put32(p, (uint32_t)P->n);
    p = ad__ckpt_put32(p, O ? (uint32_t)O->d.kind + 1 : 0);
    for (i = 0; i < P->n; i++) {
        const ad__param *q = &P->items[i];
        p = ad__ckpt_put32(p, (uint32_t)q->namelen);
        memcpy(p, q->name, q->namelen);
        p = ad__ckpt_put32(p + q->namelen, (uint32_t)q->ndim);
        for (k = 0; k < q->ndim; k++) p = ad__ckpt_put32(p, (uint32_t)q->shape[k]);
        p = ad__ckpt_put32(p, (q->frozen ? AD__CKPT_FROZEN : 0) | (q->no_decay ? AD__CKPT_NO_DECAY : 0));
        p = ad__ckpt_putf64(p, q->lr_scale);
    }
    p = ad__ckpt_put_reals(p, P->value, P->nscalars);
    if (O) {
        p = ad__ckpt_put64(p, O->steps);
        p = ad__ckpt_putf64(p, O->d.lr);
        p = ad__ckpt_putf64(p, O->d.momentum);
        p = ad__ckpt_putf64(p, O->d.dampening);
        p = ad__ckpt_putf64(p, O->d.weight_decay);
        p = ad__ckpt_putf64(p, O->d.beta1);
        p = ad__ckpt_putf64(p, O->d.beta2);
        p = ad__ckpt_putf64(p, O->d.eps);
        p = ad__ckpt_put32(p, O->d.nesterov != 0);
        p = ad__ckpt_put32(p, O->d.zero_grad != 0);
        p = ad__ckpt_putf64(p, O->d.alpha);
        p = ad__ckpt_putf64(p, O->d.lr_decay);
        p = ad__ckpt_putf64(p, O->d.initial_accumulator_value);
        p = ad__ckpt_put32(p, O->d.centered != 0);
        p = ad__ckpt_put32(p, (uint32_t)O->nbuf);
        for (k = 0; k < O->nbuf; k++) p = ad__ckpt_put_reals(p, O->state + (size_t)k * O->stride, O->n);
    }
    p = ad__ckpt_put64(p, (uint64_t)P->extra_len);
    if (P->extra_len) memcpy(p, P->extra, P->extra_len);
    p += P->extra_len;
    AUTODIFF_ASSERT((size_t)(p - buf) == len - 8);
    ad__ckpt_put64(p, ad__ckpt_hash(buf, len - 8));
}

/* Checks that O (may be NULL) is an optimizer of P made for its present parameters. */
AD__PRIVATE int ad__ckpt_optim_ok(ad_params *P, const ad_optim *O, const char *op)
{
    if (O && O->P != P) ad__pfail(P, "%s: the optimizer belongs to another parameter store", op);
    else if (O && O->n != P->nscalars)
        ad__pfail(P, "%s: the optimizer was made for %zu scalars, the store has %zu", op, O->n, P->nscalars);
    else return 1;
    return 0;
}

AUTODIFF_API size_t ad_checkpoint_size(const ad_params *P, const ad_optim *O)
{
    return P ? ad__ckpt_bytes(P, O ? O->nbuf : -1, P->extra_len) : 0;
}

AUTODIFF_API int ad_checkpoint_save_memory(void *buf, size_t cap, ad_params *P, const ad_optim *O)
{
    size_t len;
    if (!P || !ad__ckpt_optim_ok(P, O, "ad_checkpoint_save_memory")) return -1;
    len = ad_checkpoint_size(P, O);
    if (!buf || len == 0 || cap < len) {
        ad__pfail(P, "ad_checkpoint_save_memory: the buffer holds %zu bytes, the checkpoint needs %zu%s",
                  buf ? cap : 0, len, len ? "" : " (more than a size_t counts)");
        return -1;
    }
    ad__ckpt_write((unsigned char *)buf, len, P, O);
    return 0;
}

/* A cursor over the bytes of a checkpoint being loaded, and what it found. */
typedef struct ad__ckpt {
    const unsigned char *p, *end;  /* next byte to read; the checksum */
    uint32_t version;              /* format version of the file */
    const unsigned char *values;   /* the parameters' values */
    const unsigned char *state;    /* the optimizer's state buffers, or NULL */
    uint32_t kind;                 /* optimizer field of the header */
    uint64_t steps;
    ad_optim_desc d;
    int has_zero_grad;             /* d.zero_grad comes from the file (version 2 on) */
    int has_v3_settings;           /* so do alpha, lr_decay, initial_accumulator_value and
                                      centered (version 3) */
    const unsigned char *extra;    /* the program's extra bytes */
    size_t extra_len;
} ad__ckpt;

/* The next n bytes, or NULL when fewer are left. */
AD__PRIVATE const unsigned char *ad__ckpt_take(ad__ckpt *c, size_t n)
{
    const unsigned char *p = c->p;
    if ((size_t)(c->end - c->p) < n) return NULL;
    c->p += n;
    return p;
}

/* The element type field's name: "float32", "float64" or "unknown <n>". */
AD__PRIVATE const char *ad__ckpt_type_name(uint32_t esz, char *buf, size_t cap)
{
    if (esz == 4 || esz == 8) snprintf(buf, cap, "float%d", (int)(8 * esz));
    else snprintf(buf, cap, "unknown %lu", (unsigned long)esz);
    return buf;
}

/* Magic, version, element type, length, checksum and optimizer kind, in that order, so that
   a foreign or newer file is named as such rather than as corrupt. */
AD__PRIVATE int ad__ckpt_header(ad_params *P, const char *what, const unsigned char *data, size_t len, ad__ckpt *c)
{
    uint64_t stated;
    char s1[32], s2[32];
    if (len > 0 && memcmp(data, ad__ckpt_magic, len < 8 ? len : 8) != 0)
        ad__pfail(P, "%s: not an autodiff.h checkpoint (wrong magic bytes)", what);
    else if (len < AD__CKPT_HEADER + 8)
        ad__pfail(P, "%s: truncated: %zu bytes, less than a header and a checksum", what, len);
    else if ((c->version = ad__ckpt_get32(data + 8)) < 1 || c->version > AD__CKPT_VERSION)
        ad__pfail(P, "%s: format version %lu; this build reads versions 1 to %d", what,
                  (unsigned long)c->version, AD__CKPT_VERSION);
    else if (ad__ckpt_get32(data + 12) != sizeof(ad_real))
        ad__pfail(P, "%s: element type %s in the file, %s in this build (AUTODIFF_DOUBLE selects float64)", what,
                  ad__ckpt_type_name(ad__ckpt_get32(data + 12), s1, sizeof s1),
                  ad__ckpt_type_name((uint32_t)sizeof(ad_real), s2, sizeof s2));
    else if ((stated = ad__ckpt_get64(data + 16)) != (uint64_t)len)
        ad__pfail(P, "%s: %s: the file has %zu bytes, its header says %llu", what,
                  stated > (uint64_t)len ? "truncated" : "trailing bytes", len, (unsigned long long)stated);
    else if (ad__ckpt_hash(data, len - 8) != ad__ckpt_get64(data + len - 8))
        ad__pfail(P, "%s: checksum mismatch: the file is corrupt", what);
    else if ((c->kind = ad__ckpt_get32(data + 28)) > (c->version >= 3 ? 5u : 3u))
        ad__pfail(P, "%s: unknown optimizer kind %lu", what, (unsigned long)c->kind);
    else {
        c->p = data + AD__CKPT_HEADER;
        c->end = data + len - 8;
        return 1;
    }
    return 0;
}

/* "[d0,d1,...]" from ndim little-endian u32 dimensions at p. */
AD__PRIVATE char *ad__file_dims_str(const unsigned char *p, uint32_t ndim, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "[");
    uint32_t i;
    for (i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, i ? ",%lu" : "%lu", (unsigned long)ad__ckpt_get32(p + 4 * i));
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

/* A parameter's flags (version 2 on; version 1 has none: 0) and lr scale (version 3; before
   it: 1), into *flags and *scale when they are not NULL. */
AD__PRIVATE int ad__ckpt_flags(ad_params *P, const char *what, ad__ckpt *c, int i, uint32_t *flags, double *scale)
{
    const unsigned char *p = c->version >= 2 ? ad__ckpt_take(c, 4) : NULL, *s = NULL;
    uint32_t f = p ? ad__ckpt_get32(p) : 0;
    uint32_t known = c->version >= 3 ? AD__CKPT_FROZEN | AD__CKPT_NO_DECAY : AD__CKPT_FROZEN;
    double x = 1;
    if (c->version >= 2 && (!p || (f & ~known))) {
        ad__pfail(P, "%s: parameter %d: malformed flags", what, i);
        return 0;
    }
    if (c->version >= 3) {
        if (!(s = ad__ckpt_take(c, 8))) {
            ad__pfail(P, "%s: parameter %d: malformed lr scale", what, i);
            return 0;
        }
        x = ad__ckpt_getf64(s);
        if (!ad__train_finite(x) || x < 0) {
            ad__pfail(P, "%s: parameter %d: lr scale %g; it must be finite and >= 0", what, i, x);
            return 0;
        }
    }
    if (flags) *flags = f;
    if (scale) *scale = x;
    return 1;
}

/* One parameter's entry of the table: name and shape must be the store's (its flags are read
   but not compared: whether a parameter is frozen is the store's own setting). */
AD__PRIVATE int ad__ckpt_entry(ad_params *P, const char *what, ad__ckpt *c, int i)
{
    const ad__param *q = &P->items[i];
    const unsigned char *p = ad__ckpt_take(c, 4), *name, *dims;
    uint32_t namelen = p ? ad__ckpt_get32(p) : 0, ndim;
    char s1[96], s2[96];
    if (!p || !(name = ad__ckpt_take(c, namelen)) || !(p = ad__ckpt_take(c, 4))) {
        ad__pfail(P, "%s: parameter %d: malformed name", what, i);
        return 0;
    }
    if (namelen != q->namelen || memcmp(name, q->name, namelen) != 0) {
        ad__pfail(P, "%s: parameter %d: name \"%.*s\" in the file, \"%.200s\" in the store", what, i,
                  (int)(namelen < 64 ? namelen : 64), (const char *)name, q->name);
        return 0;
    }
    ndim = ad__ckpt_get32(p);
    dims = ndim <= AD_MAX_DIMS ? ad__ckpt_take(c, 4 * (size_t)ndim) : NULL;
    if (!dims) {
        ad__pfail(P, "%s: parameter %d (\"%.200s\"): malformed shape (%lu dimensions)", what, i, q->name,
                  (unsigned long)ndim);
        return 0;
    }
    ad__file_dims_str(dims, ndim, s1, sizeof s1); /* the same text means the same shape */
    if (strcmp(s1, ad__dims_str(q->ndim, q->shape, s2, sizeof s2)) != 0) {
        ad__pfail(P, "%s: parameter %d (\"%.200s\"): shape %s in the file, %s in the store", what, i, q->name, s1, s2);
        return 0;
    }
    return ad__ckpt_flags(P, what, c, i, NULL, NULL);
}

/* The optimizer section: settings, step count, state buffers; they must suit O when given. */
AD__PRIVATE int ad__ckpt_optim(ad_params *P, const char *what, ad__ckpt *c, const ad_optim *O)
{
    static const char *const names[] = {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad"};
    size_t section = c->version >= 3 ? AD__CKPT_OPTIM : c->version >= 2 ? AD__CKPT_OPTIM_V2 : AD__CKPT_OPTIM_V1;
    const unsigned char *p = ad__ckpt_take(c, section);
    const char *why;
    char count[96];
    uint32_t nbuf, nesterov, zero_grad = 0, centered = 0, k;
    if (!p) {
        ad__pfail(P, "%s: malformed optimizer section", what);
        return 0;
    }
    memset(&c->d, 0, sizeof c->d);
    c->d.kind = (ad_optim_kind)(c->kind - 1);
    c->steps = ad__ckpt_get64(p);
    c->d.lr = ad__ckpt_getf64(p + 8);
    c->d.momentum = ad__ckpt_getf64(p + 16);
    c->d.dampening = ad__ckpt_getf64(p + 24);
    c->d.weight_decay = ad__ckpt_getf64(p + 32);
    c->d.beta1 = ad__ckpt_getf64(p + 40);
    c->d.beta2 = ad__ckpt_getf64(p + 48);
    c->d.eps = ad__ckpt_getf64(p + 56);
    nesterov = ad__ckpt_get32(p + 64);
    c->d.nesterov = nesterov != 0;
    if (c->version >= 2) zero_grad = ad__ckpt_get32(p + 68);
    c->d.zero_grad = zero_grad != 0;
    c->has_zero_grad = c->version >= 2;
    if (c->version >= 3) {
        c->d.alpha = ad__ckpt_getf64(p + 72);
        c->d.lr_decay = ad__ckpt_getf64(p + 80);
        c->d.initial_accumulator_value = ad__ckpt_getf64(p + 88);
        centered = ad__ckpt_get32(p + 96);
        c->d.centered = centered != 0;
    }
    c->has_v3_settings = c->version >= 3;
    nbuf = ad__ckpt_get32(p + section - 4);
    if (O && c->d.kind != O->d.kind) {
        ad__pfail(P, "%s: optimizer %s in the file, %s here", what, names[c->kind - 1], names[O->d.kind]);
        return 0;
    }
    why = nesterov > 1     ? "nesterov is not 0 or 1"
          : zero_grad > 1  ? "zero_grad is not 0 or 1"
          : centered > 1   ? "centered is not 0 or 1"
                           : ad__optim_invalid(&c->d);
    if (!why && nbuf != (uint32_t)ad__optim_buffers(&c->d)) why = "wrong number of state buffers";
    if (!why && O && nbuf != (uint32_t)O->nbuf) {
        if (c->d.kind == AD_OPTIM_SGD) why = "momentum is on in one of file and optimizer, off in the other";
        else {
            snprintf(count, sizeof count, "the file's momentum and centered need %lu state buffers, the optimizer "
                     "has %d", (unsigned long)nbuf, O->nbuf);
            why = count;
        }
    }
    if (why) {
        ad__pfail(P, "%s: optimizer settings: %s", what, why);
        return 0;
    }
    c->state = c->p;
    for (k = 0; k < nbuf; k++)
        if (!ad__ckpt_take(c, P->nscalars * sizeof(ad_real))) {
            ad__pfail(P, "%s: malformed optimizer state", what);
            return 0;
        }
    return 1;
}

/* The program's extra bytes (version 2), which end the file. */
AD__PRIVATE int ad__ckpt_extra(ad_params *P, const char *what, ad__ckpt *c)
{
    const unsigned char *p;
    uint64_t n;
    if (c->version < 2) return 1;
    if (!(p = ad__ckpt_take(c, 8)) || (n = ad__ckpt_get64(p)) > (uint64_t)(c->end - c->p)) {
        ad__pfail(P, "%s: malformed: the extra bytes are cut short", what);
        return 0;
    }
    if (n > AD_PARAMS_EXTRA_MAX) {
        ad__pfail(P, "%s: %llu extra bytes, more than AD_PARAMS_EXTRA_MAX (%d)", what, (unsigned long long)n,
                  AD_PARAMS_EXTRA_MAX);
        return 0;
    }
    c->extra_len = (size_t)n;
    c->extra = ad__ckpt_take(c, c->extra_len);
    return 1;
}

/* Sets every parameter's group from the table of a version 3 file at p, already validated. */
AD__PRIVATE void ad__ckpt_set_groups(ad_params *P, const unsigned char *p)
{
    int i;
    for (i = 0; i < P->n; i++) {
        p += 4 + ad__ckpt_get32(p);
        p += 4 + 4 * (size_t)ad__ckpt_get32(p);
        P->items[i].no_decay = (ad__ckpt_get32(p) & AD__CKPT_NO_DECAY) != 0;
        P->items[i].lr_scale = ad__ckpt_getf64(p + 4);
        p += 12;
    }
}

/* Validates the whole checkpoint against P and O; then, and only then, loads it. */
AD__PRIVATE int ad__ckpt_load(const char *what, const unsigned char *data, size_t len, ad_params *P, ad_optim *O)
{
    ad__ckpt c;
    unsigned char *extra = NULL;
    int i;
    memset(&c, 0, sizeof c);
    if (!ad__ckpt_optim_ok(P, O, what) || !ad__ckpt_header(P, what, data, len, &c)) return -1;
    if (ad__ckpt_get32(data + 24) != (uint32_t)P->n) {
        ad__pfail(P, "%s: %lu parameters in the file, %d in the store", what,
                  (unsigned long)ad__ckpt_get32(data + 24), P->n);
        return -1;
    }
    for (i = 0; i < P->n; i++)
        if (!ad__ckpt_entry(P, what, &c, i)) return -1;
    c.values = ad__ckpt_take(&c, P->nscalars * sizeof(ad_real));
    if (!c.values) {
        ad__pfail(P, "%s: malformed: the values are cut short", what);
        return -1;
    }
    if (O && c.kind == 0) {
        ad__pfail(P, "%s: the file holds no optimizer state", what);
        return -1;
    }
    if (c.kind != 0 && !ad__ckpt_optim(P, what, &c, O)) return -1;
    if (!ad__ckpt_extra(P, what, &c)) return -1;
    if (c.p != c.end) {
        ad__pfail(P, "%s: malformed: %zu bytes left over before the checksum", what, (size_t)(c.end - c.p));
        return -1;
    }
    if (c.extra_len && !(extra = (unsigned char *)AUTODIFF_MALLOC(c.extra_len))) {
        ad__pfail(P, "%s: out of memory for %zu extra bytes", what, c.extra_len);
        return -1;
    }
    ad__ckpt_get_reals(P->value, c.values, P->nscalars);
    if (c.version >= 3) ad__ckpt_set_groups(P, data + AD__CKPT_HEADER);
    if (O) {
        if (!c.has_zero_grad) c.d.zero_grad = O->d.zero_grad;
        if (!c.has_v3_settings) {
            c.d.alpha = O->d.alpha;
            c.d.centered = O->d.centered;
            c.d.lr_decay = O->d.lr_decay;
            c.d.initial_accumulator_value = O->d.initial_accumulator_value;
        }
        O->d = c.d;
        O->steps = c.steps;
        for (i = 0; i < O->nbuf; i++)
            ad__ckpt_get_reals(O->state + (size_t)i * O->stride, c.state + (size_t)i * O->n * sizeof(ad_real), O->n);
    }
    if (c.extra_len) memcpy(extra, c.extra, c.extra_len);
    AUTODIFF_FREE(P->extra);
    P->extra = extra;
    P->extra_len = c.extra_len;
    return 0;
}

AUTODIFF_API int ad_checkpoint_load_memory(const void *data, size_t len, ad_params *P, ad_optim *O)
{
    if (!P) return -1;
    if (!data && len) {
        ad__pfail(P, "ad_checkpoint_load_memory: data is NULL");
        return -1;
    }
    return ad__ckpt_load("ad_checkpoint_load_memory", (const unsigned char *)data, len, P, O);
}

#ifndef AUTODIFF_NO_STDIO
/* "<path>.tmp-<16 hex digits>", different for each save of each store in each process. */
AD__PRIVATE char *ad__ckpt_tmp_name(ad_params *P, const char *path)
{
    size_t cap = strlen(path) + 32;
    char *name = (char *)AUTODIFF_MALLOC(cap);
    uint64_t x = (uint64_t)(uintptr_t)P ^ (uint64_t)(uintptr_t)&cap ^ ((uint64_t)time(NULL) << 24) ^
                 (uint64_t)clock() ^ (++P->saves * 0x9E3779B97F4A7C15ull);
    if (name) snprintf(name, cap, "%s.tmp-%016llx", path, (unsigned long long)ad__splitmix64(&x));
    return name;
}

/* Whether name is "<base>.tmp-<16 hex digits>", as ad__ckpt_tmp_name names temporary files. */
AD__PRIVATE int ad__ckpt_is_tmp_of(const char *name, const char *base, size_t baselen)
{
    int k;
    if (strncmp(name, base, baselen) != 0 || strncmp(name + baselen, ".tmp-", 5) != 0) return 0;
    name += baselen + 5;
    for (k = 0; k < 16; k++)
        if (!((name[k] >= '0' && name[k] <= '9') || (name[k] >= 'a' && name[k] <= 'f'))) return 0;
    return name[16] == 0;
}

/* Removes the temporary files that saves of path killed midway left in its folder, so that
   they cannot pile up. A save of the same path running at the same time elsewhere loses its
   temporary file and fails; the file at path stays whole. Without <dirent.h>, nothing. */
AD__PRIVATE void ad__ckpt_remove_leftovers(const char *path)
{
#if AD__HAS_DIRENT
    const char *slash = strrchr(path, '/'), *base;
    size_t dirlen, baselen, cap;
    char *name;
    DIR *dir;
    struct dirent *e;
#ifdef _WIN32
    if (strrchr(path, '\\') > slash) slash = strrchr(path, '\\');
#endif
    base = slash ? slash + 1 : path;
    dirlen = (size_t)(base - path);
    baselen = strlen(base);
    cap = dirlen + baselen + 32;
    if (baselen == 0 || !(name = (char *)AUTODIFF_MALLOC(cap))) return;
    memcpy(name, path, dirlen);
    name[dirlen] = 0;
    dir = opendir(dirlen ? name : ".");
    while (dir && (e = readdir(dir)) != NULL)
        if (ad__ckpt_is_tmp_of(e->d_name, base, baselen)) {
            snprintf(name + dirlen, cap - dirlen, "%s", e->d_name);
            remove(name);
        }
    if (dir) closedir(dir);
    AUTODIFF_FREE(name);
#else
    (void)path;
#endif
}

/* Renames from to to, replacing to. */
AD__PRIVATE int ad__ckpt_replace(const char *from, const char *to)
{
    int rc = rename(from, to);
#ifdef _WIN32
    if (rc != 0 && remove(to) == 0) rc = rename(from, to); /* Windows' rename does not replace */
#endif
    return rc;
}

/* Writes len bytes to tmp, closes it, then renames it to path. */
AD__PRIVATE int ad__ckpt_write_atomic(ad_params *P, const char *path, const char *tmp, const void *buf, size_t len)
{
    FILE *f = fopen(tmp, "wb");
    int ok;
    if (!f) {
        ad__pfail(P, "ad_checkpoint_save: cannot create %.200s: %s", tmp, strerror(errno));
        return -1;
    }
    ok = fwrite(buf, 1, len, f) == len;
    ok = fflush(f) == 0 && ok;
    ok = !ferror(f) && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok) ad__pfail(P, "ad_checkpoint_save: writing %.200s failed: %s", tmp, strerror(errno));
    else if (ad__ckpt_replace(tmp, path) != 0)
        ad__pfail(P, "ad_checkpoint_save: cannot rename %.200s to %.200s: %s", tmp, path, strerror(errno));
    else return 0;
    remove(tmp);
    return -1;
}

AUTODIFF_API int ad_checkpoint_save(const char *path, ad_params *P, const ad_optim *O)
{
    size_t len;
    unsigned char *buf = NULL;
    char *tmp = NULL;
    int rc = -1;
    if (!P) return -1;
    if (!path) ad__pfail(P, "ad_checkpoint_save: path is NULL");
    else if (ad__ckpt_optim_ok(P, O, "ad_checkpoint_save")) {
        len = ad_checkpoint_size(P, O);
        buf = len ? (unsigned char *)AUTODIFF_MALLOC(len) : NULL;
        tmp = ad__ckpt_tmp_name(P, path);
        if (!buf || !tmp) {
            ad__pfail(P, "ad_checkpoint_save: out of memory for a checkpoint of %zu bytes", len);
        } else {
            ad__ckpt_write(buf, len, P, O);
            ad__ckpt_remove_leftovers(path);
            rc = ad__ckpt_write_atomic(P, path, tmp, buf, len);
        }
    }
    AUTODIFF_FREE(buf);
    AUTODIFF_FREE(tmp);
    return rc;
}

/* The whole file in a new buffer, or NULL with P's error set (see ad__read_whole_file). */
AD__PRIVATE unsigned char *ad__ckpt_read_file(ad_params *P, const char *op, const char *path, size_t limit,
                                              size_t *len)
{
    char why[160];
    unsigned char *buf = ad__read_whole_file(path, limit, "any checkpoint of this store", len, why, sizeof why);
    if (!buf) ad__pfail(P, "%s: %.200s %s", op, path, why);
    return buf;
}

AUTODIFF_API int ad_checkpoint_load(const char *path, ad_params *P, ad_optim *O)
{
    size_t len = 0, limit;
    unsigned char *data;
    char what[256];
    int rc;
    if (!P) return -1;
    if (!path) {
        ad__pfail(P, "ad_checkpoint_load: path is NULL");
        return -1;
    }
    limit = ad__ckpt_bytes(P, AD__OPTIM_MAX_BUFFERS, AD_PARAMS_EXTRA_MAX);
    if (limit == 0 || limit > (size_t)-1 / 2) limit = (size_t)-1 / 2;
    data = ad__ckpt_read_file(P, "ad_checkpoint_load", path, limit, &len);
    if (!data) return -1;
    snprintf(what, sizeof what, "ad_checkpoint_load: %.200s", path);
    rc = ad__ckpt_load(what, data, len, P, O);
    AUTODIFF_FREE(data);
    return rc;
}

/* One entry of the checkpoint's table at c, read without a store to compare it with: its name
   (terminated, in name), shape and flags. Returns 0 with P's error set when it is malformed. */
AD__PRIVATE int ad__ckpt_read_entry(ad_params *P, const char *what, ad__ckpt *c, uint32_t i, char *name,
                                    int *ndim, int *shape, uint32_t *flags)
{
    const unsigned char *p = ad__ckpt_take(c, 4), *text = NULL, *dims = NULL;
    uint32_t namelen = p ? ad__ckpt_get32(p) : 0, n = 0, k;
    if (p && namelen >= 1 && namelen <= AD_PARAM_NAME_MAX && (text = ad__ckpt_take(c, namelen)) &&
        (p = ad__ckpt_take(c, 4)) && (n = ad__ckpt_get32(p)) <= AD_MAX_DIMS)
        dims = ad__ckpt_take(c, 4 * (size_t)n);
    if (!dims) {
        ad__pfail(P, "%s: parameter %lu: malformed name or shape", what, (unsigned long)i);
        return 0;
    }
    memcpy(name, text, namelen);
    name[namelen] = 0;
    *ndim = (int)n;
    for (k = 0; k < n; k++) {
        uint32_t dim = ad__ckpt_get32(dims + 4 * k);
        shape[k] = dim > INT_MAX ? -1 : (int)dim; /* ad_params_add refuses what is not positive */
    }
    return ad__ckpt_flags(P, what, c, (int)i, flags, NULL);
}

/* Adds to the empty store P every parameter named in the checkpoint's table, with zero values,
   after checking that the file holds the values of them all, so that a short file cannot make
   the store allocate what it declares; ad__ckpt_load then checks the rest and fills them. */
AD__PRIVATE int ad__ckpt_adopt(ad_params *P, const char *what, const unsigned char *data, size_t len)
{
    ad__ckpt c, table;
    char name[AD_PARAM_NAME_MAX + 1];
    int shape[AD_MAX_DIMS], ndim, k;
    uint32_t count, i, flags;
    size_t scalars = 0, size;
    memset(&c, 0, sizeof c);
    if (!ad__ckpt_header(P, what, data, len, &c)) return -1;
    count = ad__ckpt_get32(data + 24);
    if (count > AD__PARAMS_MAX) {
        ad__pfail(P, "%s: %lu parameters, more than the limit %d", what, (unsigned long)count, AD__PARAMS_MAX);
        return -1;
    }
    table = c;
    for (i = 0; i < count; i++) { /* first the sizes, against the bytes the file has left */
        if (!ad__ckpt_read_entry(P, what, &c, i, name, &ndim, shape, &flags)) return -1;
        for (k = 0, size = 1; k < ndim; k++) /* a dimension that is not positive: ad_params_add says so */
            size = shape[k] <= 0 ? 0 : (size <= (size_t)-1 / (size_t)shape[k] ? size * (size_t)shape[k] : (size_t)-1);
        scalars = ad__ckpt_add(scalars, size);
    }
    if (scalars > (size_t)(c.end - c.p) / sizeof(ad_real)) {
        ad__pfail(P, "%s: malformed: the table declares %s%zu values, the file holds at most %zu", what,
                  scalars == (size_t)-1 ? "more than " : "", scalars, (size_t)(c.end - c.p) / sizeof(ad_real));
        return -1;
    }
    c = table;
    for (i = 0; i < count; i++) { /* then the parameters */
        ad__ckpt_read_entry(P, what, &c, i, name, &ndim, shape, &flags);
        if (ad_params_add(P, name, ndim, shape, NULL) < 0) return -1;
        P->items[P->n - 1].frozen = (flags & AD__CKPT_FROZEN) != 0;
    }
    return 0;
}

AUTODIFF_API ad_params *ad_params_load(const char *path, char *err, size_t errlen)
{
    ad_params *P = ad_params_new(0);
    unsigned char *data = NULL;
    size_t len = 0;
    char what[256];
    int rc = -1;
    if (err && errlen) err[0] = 0;
    if (!P) {
        if (err && errlen) snprintf(err, errlen, "ad_params_load: out of memory");
        return NULL;
    }
    snprintf(what, sizeof what, "ad_params_load: %.200s", path ? path : "(null)");
    if (!path) ad__pfail(P, "ad_params_load: path is NULL");
    else data = ad__ckpt_read_file(P, "ad_params_load", path, (size_t)-1 / 2, &len);
    if (data && ad__ckpt_adopt(P, what, data, len) == 0) rc = ad__ckpt_load(what, data, len, P, NULL);
    AUTODIFF_FREE(data);
    if (rc == 0) return P;
    if (err && errlen) snprintf(err, errlen, "%s", ad_params_error(P) ? ad_params_error(P) : what);
    ad_params_free(P);
    return NULL;
}
#endif /* AUTODIFF_NO_STDIO */

#undef AD__CKPT_HEADER
#undef AD__CKPT_OPTIM_V1
#undef AD__CKPT_OPTIM_V2
#undef AD__CKPT_OPTIM
#undef AD__CKPT_VERSION
#undef AD__CKPT_FROZEN
#undef AD__CKPT_NO_DECAY
#undef AD__OPTIM_MAX_BUFFERS
#undef AD__PARAMS_MAX

/* >>impl:data ------------------------------------------------------------------------------- */
#ifndef AUTODIFF_DATA_MAX_BYTES
#define AUTODIFF_DATA_MAX_BYTES ((size_t)1 << 30)
#endif

#ifdef STBI_INCLUDE_STB_IMAGE_H
#define AD__HAS_STBI 1
#else
#define AD__HAS_STBI 0
#endif
#if AD__HAS_STBI && !defined(STBI_NO_ZLIB) && !(defined(STBI_NO_PNG) && !defined(STBI_SUPPORT_ZLIB))
#define AD__HAS_ZLIB 1
#else
#define AD__HAS_ZLIB 0
#endif

#define AD__NEED_STB \
    "include <stb/stb_image.h> before autodiff.h (and define STB_IMAGE_IMPLEMENTATION in one file)"

/* A new string from a format (AUTODIFF_MALLOC), or NULL when memory runs out. */
AD__PRIVATE AD__PRINTF(1, 2) char *ad__strdupf(const char *fmt, ...)
{
    va_list ap;
    int n;
    char *s;
    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    s = (char *)AUTODIFF_MALLOC((size_t)n + 1);
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

AD__PRIVATE uint32_t ad__be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

AD__PRIVATE uint32_t ad__le32(const unsigned char *p)
{
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | (uint32_t)p[0];
}

/* CRC-32 as in gzip and PNG (reflected polynomial 0xEDB88320). */
AD__PRIVATE uint32_t ad__crc32(const unsigned char *p, size_t n)
{
    uint32_t table[256], c;
    size_t i;
    int k;
    for (i = 0; i < 256; i++) {
        c = (uint32_t)i;
        for (k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    c = 0xFFFFFFFFu;
    for (i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* The whole file at path into a new buffer, at most AUTODIFF_DATA_MAX_BYTES; errors are
   "<path> <why>". */
AD__PRIVATE int ad__read_file(const char *path, unsigned char **bytes, size_t *len, char *err, size_t errlen)
{
    char why[160];
    *bytes = ad__read_whole_file(path, AUTODIFF_DATA_MAX_BYTES, "AUTODIFF_DATA_MAX_BYTES", len, why, sizeof why);
    return *bytes ? 0 : ad__fail_into(err, errlen, "%.200s %s", path, why);
}

AD__PRIVATE int ad__file_exists(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fclose(f);
    return 1;
}

/* >>impl:data gzip --------------------------------------------------------------------------- */
AD__PRIVATE int ad__is_gzip(const unsigned char *p, size_t len)
{
    return len >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

/* Moves *pos past a zero-terminated header field; 0 when the terminator is missing. */
AD__PRIVATE int ad__skip_zstring(const unsigned char *p, size_t len, size_t *pos)
{
    while (*pos < len && p[*pos] != 0) ++*pos;
    if (*pos >= len) return 0;
    ++*pos;
    return 1;
}

/* Checks an RFC 1952 member header; *start becomes the offset of the deflate data, which must be
   followed by at least the 8-byte trailer. */
AD__PRIVATE int ad__gzip_header(const unsigned char *p, size_t len, size_t *start, char *err,
                                size_t errlen)
{
    size_t pos = 10;
    int flg;
    if (len < 18)
        return ad__fail_into(err, errlen, "gzip: %zu bytes, too short for a gzip header and trailer", len);
    if (p[0] != 0x1f || p[1] != 0x8b) return ad__fail_into(err, errlen, "gzip: bad magic bytes");
    if (p[2] != 8)
        return ad__fail_into(err, errlen, "gzip: compression method %d; only 8 (deflate) is defined", p[2]);
    flg = p[3];
    if (flg & 0xE0) return ad__fail_into(err, errlen, "gzip: reserved flag bits set (FLG 0x%02x)", flg);
    if (flg & 0x04) { /* FEXTRA: XLEN, then XLEN bytes */
        size_t xlen;
        if (len - pos < 2) return ad__fail_into(err, errlen, "gzip: header truncated in FEXTRA");
        xlen = (size_t)p[pos] | (size_t)p[pos + 1] << 8;
        pos += 2;
        if (len - pos < xlen) return ad__fail_into(err, errlen, "gzip: header truncated in FEXTRA");
        pos += xlen;
    }
    if ((flg & 0x08) && !ad__skip_zstring(p, len, &pos))
        return ad__fail_into(err, errlen, "gzip: header truncated in FNAME");
    if ((flg & 0x10) && !ad__skip_zstring(p, len, &pos))
        return ad__fail_into(err, errlen, "gzip: header truncated in FCOMMENT");
    if (flg & 0x02) { /* FHCRC: the low 16 bits of the CRC-32 of the header so far */
        unsigned stored;
        if (len - pos < 2) return ad__fail_into(err, errlen, "gzip: header truncated in FHCRC");
        stored = (unsigned)p[pos] | (unsigned)p[pos + 1] << 8;
        if ((ad__crc32(p, pos) & 0xFFFFu) != stored)
            return ad__fail_into(err, errlen, "gzip: header CRC mismatch");
        pos += 2;
    }
    if (len - pos < 9)
        return ad__fail_into(err, errlen, "gzip: truncated: no deflate data before the 8-byte trailer");
    *start = pos;
    return 0;
}

/* Inflates a single-member gzip stream with stb_image's zlib decoder into a new buffer of
   exactly ISIZE bytes (at least one allocated), then checks the trailer's ISIZE and CRC-32.
   Bytes after the member are not allowed: the trailer is the last 8 bytes of the data. */
AD__PRIVATE int ad__gunzip(const unsigned char *p, size_t len, unsigned char **out, size_t *outlen,
                           char *err, size_t errlen)
{
#if AD__HAS_ZLIB
    size_t start = 0, dlen;
    uint32_t crc, isize;
    unsigned char *buf;
    int got;
    *out = NULL;
    *outlen = 0;
    if (ad__gzip_header(p, len, &start, err, errlen)) return -1;
    dlen = len - 8 - start;
    crc = ad__le32(p + len - 8);
    isize = ad__le32(p + len - 4);
    if (isize > AUTODIFF_DATA_MAX_BYTES || isize > (uint32_t)INT_MAX || dlen > (size_t)INT_MAX - 8)
        return ad__fail_into(err, errlen,
                             "gzip: ISIZE %lu bytes is above the limit of %zu (AUTODIFF_DATA_MAX_BYTES)",
                             (unsigned long)isize, (size_t)AUTODIFF_DATA_MAX_BYTES);
    if ((uint64_t)isize > (uint64_t)dlen * 1032 + 1032) /* deflate expands at most 1032:1 */
        return ad__fail_into(err, errlen, "gzip: ISIZE %lu bytes cannot come from %zu bytes of deflate data",
                             (unsigned long)isize, dlen);
    buf = (unsigned char *)AUTODIFF_MALLOC(isize ? isize : 1);
    if (!buf) return ad__fail_into(err, errlen, "gzip: out of memory for %lu bytes", (unsigned long)isize);
    /* The trailer goes along as lookahead: older stb_image versions refuse a final Huffman code
       read with fewer than 16 bits of input left. The decoder stops at the final block. */
    got = stbi_zlib_decode_noheader_buffer((char *)buf, (int)isize, (const char *)p + start, (int)dlen + 8);
    if (got < 0 || (uint32_t)got != isize) {
        const char *why = stbi_failure_reason();
        AUTODIFF_FREE(buf);
        if (got >= 0)
            return ad__fail_into(err, errlen, "gzip: ISIZE says %lu bytes but the deflate data holds %d",
                                 (unsigned long)isize, got);
        return ad__fail_into(err, errlen,
                             "gzip: deflate data is corrupt or longer than ISIZE = %lu bytes (stb_image: %s)",
                             (unsigned long)isize, why ? why : "no reason given");
    }
    if (ad__crc32(buf, isize) != crc) {
        uint32_t actual = ad__crc32(buf, isize);
        AUTODIFF_FREE(buf);
        return ad__fail_into(err, errlen, "gzip: CRC-32 mismatch: the trailer says 0x%08lx, the data has 0x%08lx",
                             (unsigned long)crc, (unsigned long)actual);
    }
    *out = buf;
    *outlen = isize;
    return 0;
#else
    (void)p;
    (void)len;
    *out = NULL;
    *outlen = 0;
    return ad__fail_into(err, errlen, "gzip data: to read .gz files, " AD__NEED_STB "; or gunzip the file");
#endif
}

/* >>impl:data IDX ---------------------------------------------------------------------------- */
/* Checks a raw IDX header against the length of the data; fills idx's ndim, dims and size and
   the header's length. */
AD__PRIVATE int ad__idx_check(const unsigned char *p, size_t len, ad_idx *idx, size_t *header, char *err,
                              size_t errlen)
{
    size_t size = 1, room;
    uint32_t magic;
    int i;
    if (len < 4) return ad__fail_into(err, errlen, "IDX: %zu bytes, too short for the 4-byte magic", len);
    magic = ad__be32(p);
    if (magic != 0x803 && magic != 0x801)
        return ad__fail_into(err, errlen,
                             "IDX: magic 0x%08lx; expected 0x00000803 (images) or 0x00000801 (labels)",
                             (unsigned long)magic);
    idx->ndim = magic == 0x803 ? 3 : 1;
    *header = 4 + 4 * (size_t)idx->ndim;
    if (len < *header)
        return ad__fail_into(err, errlen, "IDX: %zu bytes, too short for the %zu-byte header", len, *header);
    for (i = 0; i < idx->ndim; i++) {
        uint32_t d = ad__be32(p + 4 + 4 * i);
        if (d == 0 || d > (uint32_t)INT_MAX)
            return ad__fail_into(err, errlen, "IDX: dimension %d is %lu; must be 1..%d", i, (unsigned long)d,
                                 INT_MAX);
        idx->dims[i] = (int)d;
    }
    room = AUTODIFF_DATA_MAX_BYTES > *header ? AUTODIFF_DATA_MAX_BYTES - *header : 0;
    for (i = 0; i < idx->ndim; i++) {
        if ((size_t)idx->dims[i] > room / size) {
            char dims[64];
            ad__dims_str(idx->ndim, idx->dims, dims, sizeof dims);
            return ad__fail_into(err, errlen, "IDX: dimensions %s multiply to more than the limit of %zu bytes "
                                 "(AUTODIFF_DATA_MAX_BYTES)", dims, (size_t)AUTODIFF_DATA_MAX_BYTES);
        }
        size *= (size_t)idx->dims[i];
    }
    idx->size = size;
    if (len - *header < size)
        return ad__fail_into(err, errlen, "IDX: truncated: the header promises %zu data bytes, the file has %zu",
                             size, len - *header);
    if (len - *header > size)
        return ad__fail_into(err, errlen, "IDX: %zu bytes of trailing garbage after the %zu data bytes",
                             len - *header - size, size);
    return 0;
}

/* Takes over a raw IDX buffer: on success idx->data is that buffer with the header moved out,
   on failure the buffer is freed and idx zeroed. */
AD__PRIVATE int ad__idx_adopt(unsigned char *buf, size_t len, ad_idx *idx, char *err, size_t errlen)
{
    size_t header = 0;
    if (ad__idx_check(buf, len, idx, &header, err, errlen)) {
        AUTODIFF_FREE(buf);
        memset(idx, 0, sizeof *idx);
        return -1;
    }
    memmove(buf, buf + header, idx->size);
    idx->data = buf;
    return 0;
}

/* Parses bytes that the caller keeps: inflates gzip, else copies, then adopts the result. */
AD__PRIVATE int ad__idx_decode(const unsigned char *p, size_t len, ad_idx *idx, char *err, size_t errlen)
{
    unsigned char *raw;
    size_t rawlen = len;
    if (ad__is_gzip(p, len)) {
        if (ad__gunzip(p, len, &raw, &rawlen, err, errlen)) return -1;
    } else {
        raw = (unsigned char *)AUTODIFF_MALLOC(len ? len : 1);
        if (!raw) return ad__fail_into(err, errlen, "IDX: out of memory for %zu bytes", len);
        if (len) memcpy(raw, p, len);
    }
    return ad__idx_adopt(raw, rawlen, idx, err, errlen);
}

AUTODIFF_API int ad_idx_parse_memory(const void *bytes, size_t len, ad_idx *idx, char *err, size_t errlen)
{
    char why[256];
    if (!idx) return ad__fail_into(err, errlen, "ad_idx_parse_memory: idx is NULL");
    memset(idx, 0, sizeof *idx);
    if (!bytes && len) return ad__fail_into(err, errlen, "ad_idx_parse_memory: bytes is NULL");
    if (ad__idx_decode((const unsigned char *)bytes, bytes ? len : 0, idx, why, sizeof why))
        return ad__fail_into(err, errlen, "ad_idx_parse_memory: %s", why);
    return 0;
}

/* An IDX file, raw or gzip, into idx; errors are "<path>: <why>". */
AD__PRIVATE int ad__idx_load_file(const char *path, ad_idx *idx, char *err, size_t errlen)
{
    unsigned char *buf;
    size_t len;
    char why[256];
    int rc;
    memset(idx, 0, sizeof *idx);
    if (ad__read_file(path, &buf, &len, err, errlen)) return -1;
    if (ad__is_gzip(buf, len)) {
        unsigned char *raw;
        rc = ad__gunzip(buf, len, &raw, &len, why, sizeof why);
        AUTODIFF_FREE(buf);
        if (rc) return ad__fail_into(err, errlen, "%.200s: %s", path, why);
        buf = raw;
    }
    if (ad__idx_adopt(buf, len, idx, why, sizeof why)) return ad__fail_into(err, errlen, "%.200s: %s", path, why);
    return 0;
}

AUTODIFF_API int ad_idx_load(const char *path, ad_idx *idx, char *err, size_t errlen)
{
    char why[512];
    if (!idx) return ad__fail_into(err, errlen, "ad_idx_load: idx is NULL");
    memset(idx, 0, sizeof *idx);
    if (!path) return ad__fail_into(err, errlen, "ad_idx_load: path is NULL");
    if (ad__idx_load_file(path, idx, why, sizeof why)) return ad__fail_into(err, errlen, "ad_idx_load: %s", why);
    return 0;
}

AUTODIFF_API void ad_idx_free(ad_idx *idx)
{
    if (!idx) return;
    AUTODIFF_FREE(idx->data);
    memset(idx, 0, sizeof *idx);
}

/* >>impl:data dataset ------------------------------------------------------------------------ */
/* Allocates x (and labels when with_labels) for count samples of the given shape. */
AD__PRIVATE int ad__dataset_alloc(ad_dataset *ds, int count, int ndim, const int *shape, int with_labels,
                                  char *err, size_t errlen)
{
    size_t sample = 1, max_values = AUTODIFF_DATA_MAX_BYTES;
    int i;
    memset(ds, 0, sizeof *ds);
    for (i = 0; i < ndim; i++) {
        if (shape[i] < 1 || (size_t)shape[i] > max_values / sample)
            return ad__fail_into(err, errlen, "the sample shape is too large");
        sample *= (size_t)shape[i];
    }
    if (count < 1 || (size_t)count > max_values / sample || (size_t)count * sample > (size_t)-1 / sizeof(ad_real))
        return ad__fail_into(err, errlen,
                             "%d samples of %zu values are above the limit (AUTODIFF_DATA_MAX_BYTES)", count,
                             sample);
    ds->x = (ad_real *)AUTODIFF_MALLOC((size_t)count * sample * sizeof(ad_real));
    ds->labels = with_labels ? (int *)AUTODIFF_MALLOC((size_t)count * sizeof(int)) : NULL;
    if (!ds->x || (with_labels && !ds->labels)) {
        ad_dataset_free(ds);
        return ad__fail_into(err, errlen, "out of memory for %d samples of %zu values", count, sample);
    }
    ds->count = count;
    ds->ndim = ndim;
    for (i = 0; i < ndim; i++) ds->shape[i] = shape[i];
    ds->sample_size = sample;
    return 0;
}

/* Bytes 0..255 to values 0..1. */
AD__PRIVATE void ad__bytes_to_unit(const unsigned char *src, size_t n, ad_real *dst)
{
    ad_real table[256];
    size_t i;
    for (i = 0; i < 256; i++) table[i] = (ad_real)((double)i / 255.0);
    for (i = 0; i < n; i++) dst[i] = table[src[i]];
}

AUTODIFF_API int ad_dataset_from_idx(const ad_idx *images, const ad_idx *labels, ad_dataset *ds, char *err,
                                     size_t errlen)
{
    char why[256];
    int shape[3], i;
    if (!ds) return ad__fail_into(err, errlen, "ad_dataset_from_idx: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!images || images->ndim != 3 || !images->data)
        return ad__fail_into(err, errlen,
                             "ad_dataset_from_idx: images must be an IDX image file (magic 0x00000803)");
    if (labels && (labels->ndim != 1 || !labels->data))
        return ad__fail_into(err, errlen,
                             "ad_dataset_from_idx: labels must be an IDX label file (magic 0x00000801)");
    if (labels && labels->dims[0] != images->dims[0])
        return ad__fail_into(err, errlen, "ad_dataset_from_idx: %d images but %d labels", images->dims[0],
                             labels->dims[0]);
    shape[0] = 1;
    shape[1] = images->dims[1];
    shape[2] = images->dims[2];
    if (ad__dataset_alloc(ds, images->dims[0], 3, shape, labels != NULL, why, sizeof why))
        return ad__fail_into(err, errlen, "ad_dataset_from_idx: %s", why);
    ad__bytes_to_unit(images->data, images->size, ds->x);
    for (i = 0; labels && i < ds->count; i++) {
        ds->labels[i] = labels->data[i];
        if (ds->labels[i] + 1 > ds->classes) ds->classes = ds->labels[i] + 1;
    }
    return 0;
}

/* The path of an MNIST file in dir: the raw file if it exists, else the .gz one, else NULL with
   err set (also when memory runs out). */
AD__PRIVATE char *ad__mnist_path(const char *dir, const char *split, const char *kind, char *err, size_t errlen)
{
    char *raw = ad__strdupf("%s/%s-%s", dir, split, kind), *gz;
    if (!raw) {
        ad__fail_into(err, errlen, "out of memory");
        return NULL;
    }
    if (ad__file_exists(raw)) return raw;
    gz = ad__strdupf("%s.gz", raw);
    if (gz && ad__file_exists(gz)) {
        AUTODIFF_FREE(raw);
        return gz;
    }
    ad__fail_into(err, errlen, "neither %s nor %s.gz exists", raw, raw);
    AUTODIFF_FREE(raw);
    AUTODIFF_FREE(gz);
    return NULL;
}

/* Loads one MNIST file of the split into idx. */
AD__PRIVATE int ad__mnist_part(const char *dir, const char *split, const char *kind, ad_idx *idx, char *err,
                               size_t errlen)
{
    char *path = ad__mnist_path(dir, split, kind, err, errlen);
    int rc;
    memset(idx, 0, sizeof *idx);
    if (!path) return -1;
    rc = ad__idx_load_file(path, idx, err, errlen);
    AUTODIFF_FREE(path);
    return rc;
}

AUTODIFF_API int ad_mnist_load(const char *dir, const char *split, ad_dataset *ds, char *err, size_t errlen)
{
    ad_idx images, labels;
    char why[512];
    int rc = -1;
    if (!ds) return ad__fail_into(err, errlen, "ad_mnist_load: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!dir || !split) return ad__fail_into(err, errlen, "ad_mnist_load: dir or split is NULL");
    memset(&images, 0, sizeof images);
    memset(&labels, 0, sizeof labels);
    if (ad__mnist_part(dir, split, "images-idx3-ubyte", &images, why, sizeof why) == 0 &&
        ad__mnist_part(dir, split, "labels-idx1-ubyte", &labels, why, sizeof why) == 0)
        rc = ad_dataset_from_idx(&images, &labels, ds, why, sizeof why);
    ad_idx_free(&images);
    ad_idx_free(&labels);
    return rc ? ad__fail_into(err, errlen, "ad_mnist_load: %s", why) : 0;
}

AUTODIFF_API void ad_dataset_free(ad_dataset *ds)
{
    int i;
    if (!ds) return;
    for (i = 0; ds->class_names && i < ds->classes; i++) AUTODIFF_FREE(ds->class_names[i]);
    AUTODIFF_FREE(ds->class_names);
    AUTODIFF_FREE(ds->x);
    AUTODIFF_FREE(ds->labels);
    memset(ds, 0, sizeof *ds);
}

/* >>impl:data images ------------------------------------------------------------------------- */
/* Whether an image of channels x height x width values fits the limit: its values, as ad_real,
   at most AUTODIFF_DATA_MAX_BYTES. */
AD__PRIVATE int ad__image_size_ok(int channels, int height, int width)
{
    size_t most = AUTODIFF_DATA_MAX_BYTES / sizeof(ad_real);
    return channels > 0 && height > 0 && width > 0 && (size_t)height <= most / (size_t)channels &&
           (size_t)width <= most / ((size_t)channels * (size_t)height);
}

/* Allocates img for channels x height x width values; errors begin with op. */
AD__PRIVATE int ad__image_alloc(const char *op, ad_image *img, int channels, int height, int width, char *err,
                                size_t errlen)
{
    size_t n;
    memset(img, 0, sizeof *img);
    if (channels < 1 || height < 1 || width < 1)
        return ad__fail_into(err, errlen, "%s: size %dx%dx%d is empty", op, channels, height, width);
    if (!ad__image_size_ok(channels, height, width))
        return ad__fail_into(err, errlen, "%s: size %dx%dx%d is above the limit of %zu bytes of values "
                             "(AUTODIFF_DATA_MAX_BYTES)", op, channels, height, width, (size_t)AUTODIFF_DATA_MAX_BYTES);
    n = (size_t)channels * (size_t)height * (size_t)width;
    img->data = (ad_real *)AUTODIFF_MALLOC(n * sizeof(ad_real));
    if (!img->data) return ad__fail_into(err, errlen, "%s: out of memory for %zu values", op, n);
    img->channels = channels;
    img->height = height;
    img->width = width;
    return 0;
}

AUTODIFF_API void ad_image_free(ad_image *img)
{
    if (!img) return;
    AUTODIFF_FREE(img->data);
    memset(img, 0, sizeof *img);
}

/* Interleaved bytes [H, W, C] to planar values [C, H, W] in [0, 1]. */
AD__PRIVATE void ad__pixels_to_planes(const unsigned char *pix, int channels, int height, int width, ad_real *dst)
{
    size_t plane = (size_t)height * (size_t)width, i;
    int c;
    for (c = 0; c < channels; c++)
        for (i = 0; i < plane; i++)
            dst[(size_t)c * plane + i] = (ad_real)(pix[i * (size_t)channels + (size_t)c] / 255.0);
}

/* ---- keeping stb_image's input within what it handles safely ----
   Debian 12's stb_image 2.27 has faults that a crafted (or merely unusual) file reaches; the
   checks below refuse such files, or mend them, before stb_image sees them. Each follows what
   stb_image itself reads: where it reads past the end of the data it sees zeros. */

/* The Huffman tables of a DHT segment at p (its length field first; end is the end of the
   data), read as stb_image reads them; defined[class][index] is set for each. Returns 0 when a
   table declares more than 256 codes: stb_image writes such a table's code lengths and symbols
   past its arrays. */
AD__PRIVATE int ad__jpeg_dht_ok(const unsigned char *p, const unsigned char *end, unsigned char defined[2][4])
{
    long left = end - p >= 2 ? (long)(p[0] << 8 | p[1]) - 2 : 0;
    int i, n;
    p += 2;
    while (left > 0 && p < end) {
        if (p[0] >> 4 <= 1 && (p[0] & 15) <= 3) defined[p[0] >> 4][p[0] & 15] = 1;
        for (i = 1, n = 0; i <= 16; i++) n += p + i < end ? p[i] : 0;
        if (n > 256) return 0;
        if (end - p <= 17 + n) break;
        p += 17 + n;
        left -= 17 + n;
    }
    return 1;
}

/* Whether the scan whose SOS segment is at p (its length field first) decodes only with
   Huffman tables that a DHT defined before it: stb_image leaves the others uninitialised and
   indexes its arrays with what they hold. A scan of DC coefficients (Ss 0) reads DC tables,
   unless it refines (Ah > 0) a progressive one, and a scan that reaches AC coefficients
   (Se > 0) reads AC tables. */
AD__PRIVATE int ad__jpeg_scan_ok(const unsigned char *p, const unsigned char *end, unsigned char defined[2][4],
                                 int progressive)
{
    int ns = end - p > 2 ? p[2] : 0, i, ss, se, ah;
    if (ns < 1 || ns > 4 || end - p < 6 + 2 * ns) return 1; /* stb_image refuses it */
    ss = p[3 + 2 * ns];
    se = p[4 + 2 * ns];
    ah = p[5 + 2 * ns] >> 4;
    for (i = 0; i < ns; i++) {
        int dc = p[4 + 2 * i] >> 4, ac = p[4 + 2 * i] & 15;
        if (dc > 3 || ac > 3) return 1; /* refused by stb_image */
        if (ss == 0 && !(progressive && ah > 0) && !defined[0][dc]) return 0;
        if (se > 0 && !defined[1][ac]) return 0;
    }
    return 1;
}

/* Whether every Huffman table of a JPEG is one stb_image can hold, and defined before a scan
   uses it. stb_image takes a file that
   starts with 0xFF bytes and then 0xD8 for a JPEG, and reads a DHT marker wherever it finds one
   between segments, skipping padding, and after a scan at the first 0xFF that the
   entropy-coded data does not escape; this walk checks every such place. */
AD__PRIVATE int ad__jpeg_tables_ok(const unsigned char *p, size_t len)
{
    const unsigned char *end = p + len, *q = p;
    unsigned char defined[2][4];
    int progressive = 0;
    memset(defined, 0, sizeof defined);
    while (q < end && *q == 0xFF) q++;
    if (q == p || q >= end || *q != 0xD8) return 1; /* not a JPEG */
    q++;
    while (q < end) {
        int m;
        size_t seg;
        if (*q != 0xFF) { q++; continue; }  /* padding, or entropy-coded data after a scan */
        while (q < end && *q == 0xFF) q++;
        if (q >= end) break;
        m = *q++;
        if (m == 0x00 || (m >= 0xD0 && m <= 0xD9) || m == 0x01) continue; /* no length field */
        if (m == 0xC4 && !ad__jpeg_dht_ok(q, end, defined)) return 0;
        if (m == 0xC2) progressive = 1;
        if (m == 0xDA && !ad__jpeg_scan_ok(q, end, defined, progressive)) return 0;
        if (end - q < 2) break;
        seg = (size_t)(q[0] << 8 | q[1]);
        q = (size_t)(end - q) < seg ? end : q + seg; /* after SOS: the scan's data, walked on */
    }
    return 1;
}

/* Whether a binary PGM or PPM (P5, P6) header reads as stb_image reads it without its int
   arithmetic overflowing, its samples are 8-bit (stb_image 2.27 takes the low byte of a 16-bit
   sample, and reads past its buffer when it converts channels), and the file holds all the
   pixels it declares (stb_image returns uninitialised memory for the missing ones). Other
   files pass. */
AD__PRIVATE int ad__pnm_ok(const unsigned char *p, size_t len)
{
    unsigned long v[3];
    size_t i = 2, need;
    int field;
    if (len < 2 || p[0] != 'P' || (p[1] != '5' && p[1] != '6')) return 1;
    for (field = 0; field < 3; field++) {
        int digits = 0;
        for (;;) { /* white space and # comments, as stb_image skips them */
            while (i < len && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) i++;
            if (i >= len || p[i] != '#') break;
            while (i < len && p[i] != '\n' && p[i] != '\r') i++;
        }
        for (v[field] = 0; i < len && p[i] >= '0' && p[i] <= '9' && digits < 9; i++, digits++)
            v[field] = v[field] * 10 + (unsigned long)(p[i] - '0');
        if (digits == 0 || (i < len && p[i] >= '0' && p[i] <= '9')) return 0;
    }
    if (i >= len || v[2] > 255) return 0;
    i++; /* the pixels start after the character that ends the largest value */
    need = (size_t)v[0] * (size_t)v[1] * (p[1] == '6' ? 3u : 1u);
    return len - i >= need;
}

/* Whether every chunk of a PNG fits in the file (stb_image allocates an IDAT chunk's stated
   length before reading it); *empty_idat is set when an IDAT chunk is empty, which the PNG
   standard allows and stb_image mishandles. Other files pass. */
AD__PRIVATE int ad__png_chunks_ok(const unsigned char *p, size_t len, int *empty_idat)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    size_t at = 8;
    *empty_idat = 0;
    if (len < 8 || memcmp(p, sig, 8) != 0) return 1;
    while (len - at >= 8) {
        size_t n = (size_t)p[at] << 24 | (size_t)p[at + 1] << 16 | (size_t)p[at + 2] << 8 | p[at + 3];
        if (n > len - at - 8) return 0;
        if (n == 0 && memcmp(p + at + 4, "IDAT", 4) == 0) *empty_idat = 1;
        if (memcmp(p + at + 4, "IEND", 4) == 0 || len - at - 8 - n < 4) break; /* the end, or no CRC */
        at += 12 + n;
    }
    return 1;
}

/* The PNG at p without its empty IDAT chunks, written into out (len bytes); returns its length.
   Each chunk has its own CRC, so the rest stays valid. */
AD__PRIVATE size_t ad__png_drop_empty_idat(const unsigned char *p, size_t len, unsigned char *out)
{
    size_t at = 8, o = 8;
    memcpy(out, p, 8);
    while (len - at >= 12) {
        size_t n = (size_t)p[at] << 24 | (size_t)p[at + 1] << 16 | (size_t)p[at + 2] << 8 | p[at + 3];
        size_t whole = n <= len - at - 12 ? 12 + n : len - at;
        if (!(n == 0 && memcmp(p + at + 4, "IDAT", 4) == 0)) {
            memcpy(out + o, p + at, whole);
            o += whole;
        }
        at += whole;
    }
    memcpy(out + o, p + at, len - at);
    return o + len - at;
}

/* Why stb_image must not see these bytes, or NULL. PSD, Radiance HDR and Softimage PIC files
   are refused whole: stb_image converts PSD alpha with out-of-range casts and loops forever on
   a cut-short HDR, and neither is a format of training data. */
AD__PRIVATE const char *ad__stb_refusal(const unsigned char *p, size_t len, int *empty_idat)
{
    if ((len >= 4 && memcmp(p, "8BPS", 4) == 0) || (len >= 2 && memcmp(p, "#?", 2) == 0) ||
        (len >= 4 && memcmp(p, "\x53\x80\xF6\x34", 4) == 0))
        return "PSD, HDR and PIC files are not read (formats: PNG, JPEG, BMP, GIF, TGA, PGM, PPM)";
    if (!ad__jpeg_tables_ok(p, len))
        return "corrupt JPEG: a Huffman table declares more than 256 codes, or a scan uses one not defined";
    if (!ad__pnm_ok(p, len))
        return "PGM/PPM: a malformed header, 16-bit samples (not read), or fewer pixels than it declares";
    if (!ad__png_chunks_ok(p, len, empty_idat)) return "corrupt PNG: a chunk is longer than the file";
    return NULL;
}

/* Decodes len bytes; errors begin with op. */
AD__PRIVATE int ad__image_decode(const char *op, const unsigned char *bytes, size_t len, int channels, ad_image *img,
                                 char *err, size_t errlen)
{
#if AD__HAS_STBI
    int w, h, n, empty_idat = 0;
    unsigned char *pix, *mended = NULL;
    const char *why;
    memset(img, 0, sizeof *img);
    if (channels < 1 || channels > 4)
        return ad__fail_into(err, errlen, "%s: channels %d; use 1 (gray), 2 (gray+alpha), 3 (RGB) or 4 (RGBA)", op,
                             channels);
    if (!bytes || len == 0) return ad__fail_into(err, errlen, "%s: no data", op);
    if (len > (size_t)INT_MAX || len > AUTODIFF_DATA_MAX_BYTES)
        return ad__fail_into(err, errlen, "%s: %zu bytes, above the limit (AUTODIFF_DATA_MAX_BYTES)", op, len);
    if ((why = ad__stb_refusal(bytes, len, &empty_idat)) != NULL) return ad__fail_into(err, errlen, "%s: %s", op, why);
    if (empty_idat) {
        if (!(mended = (unsigned char *)AUTODIFF_MALLOC(len)))
            return ad__fail_into(err, errlen, "%s: out of memory for %zu bytes", op, len);
        len = ad__png_drop_empty_idat(bytes, len, mended);
        bytes = mended;
    }
    /* the size first, from the header alone: a small file may declare a huge image */
    if (!stbi_info_from_memory(bytes, (int)len, &w, &h, &n)) {
        why = stbi_failure_reason();
        AUTODIFF_FREE(mended);
        return ad__fail_into(err, errlen, "%s: stb_image cannot decode it: %s", op, why ? why : "no reason given");
    }
    if (!ad__image_size_ok(channels, h, w)) {
        AUTODIFF_FREE(mended);
        return ad__fail_into(err, errlen, "%s: the file declares %dx%d pixels: %d channels of them are above the "
                             "limit of %zu bytes of values (AUTODIFF_DATA_MAX_BYTES)", op, w, h, channels,
                             (size_t)AUTODIFF_DATA_MAX_BYTES);
    }
    pix = stbi_load_from_memory(bytes, (int)len, &w, &h, &n, channels);
    AUTODIFF_FREE(mended);
    if (!pix) {
        why = stbi_failure_reason();
        return ad__fail_into(err, errlen, "%s: stb_image cannot decode it: %s", op, why ? why : "no reason given");
    }
    if (ad__image_alloc(op, img, channels, h, w, err, errlen) == 0)
        ad__pixels_to_planes(pix, channels, h, w, img->data);
    stbi_image_free(pix);
    return img->data ? 0 : -1;
#else
    (void)bytes;
    (void)len;
    (void)channels;
    memset(img, 0, sizeof *img);
    return ad__fail_into(err, errlen, "%s: to decode images, " AD__NEED_STB, op);
#endif
}

AUTODIFF_API int ad_image_load_memory(const void *bytes, size_t len, int channels, ad_image *img, char *err,
                                      size_t errlen)
{
    if (!img) return ad__fail_into(err, errlen, "ad_image_load_memory: img is NULL");
    return ad__image_decode("ad_image_load_memory", (const unsigned char *)bytes, len, channels, img, err, errlen);
}

/* The image file at path into img; errors are "<path>: <why>". */
AD__PRIVATE int ad__image_file(const char *path, int channels, ad_image *img, char *err, size_t errlen)
{
    unsigned char *buf;
    size_t len;
    char op[256];
    int rc;
    memset(img, 0, sizeof *img);
    if (ad__read_file(path, &buf, &len, err, errlen)) return -1;
    snprintf(op, sizeof op, "%.200s", path);
    rc = ad__image_decode(op, buf, len, channels, img, err, errlen);
    AUTODIFF_FREE(buf);
    return rc;
}

AUTODIFF_API int ad_image_load(const char *path, int channels, ad_image *img, char *err, size_t errlen)
{
    char why[512];
    if (!img) return ad__fail_into(err, errlen, "ad_image_load: img is NULL");
    memset(img, 0, sizeof *img);
    if (!path) return ad__fail_into(err, errlen, "ad_image_load: path is NULL");
    if (ad__image_file(path, channels, img, why, sizeof why)) return ad__fail_into(err, errlen, "ad_image_load: %s", why);
    return 0;
}

/* One axis of a resize: output i is the sum over k < ntaps of w[i * ntaps + k] times input
   idx[i * ntaps + k]. The weights of an output are non-negative and sum to 1. */
typedef struct ad__taps {
    int ntaps;
    int *idx;
    ad_real *w;
} ad__taps;

/* Shrinking: output i averages the input cells covering [i * in/out, (i + 1) * in/out). */
AD__PRIVATE void ad__taps_area(int in, int out, int i, int ntaps, int *idx, ad_real *w)
{
    double scale = (double)in / out, lo = i * scale, hi = lo + scale, total = 0;
    int first = (int)lo, k;
    for (k = 0; k < ntaps; k++) {
        int j = first + k;
        double a = j > lo ? j : lo, b = j + 1 < hi ? j + 1 : hi, v = (j < in && b > a) ? b - a : 0;
        idx[k] = j < in ? j : in - 1;
        w[k] = (ad_real)v;
        total += v;
    }
    for (k = 0; k < ntaps; k++) w[k] = (ad_real)(w[k] / total);
}

/* Enlarging: linear interpolation between the two input pixel centres around output i's centre. */
AD__PRIVATE void ad__taps_linear(int in, int out, int i, int *idx, ad_real *w)
{
    double centre = (i + 0.5) * in / out - 0.5, f;
    int j;
    if (centre < 0) centre = 0;
    if (centre > in - 1) centre = in - 1;
    j = (int)centre;
    f = centre - j;
    idx[0] = j;
    idx[1] = j + 1 < in ? j + 1 : j;
    w[0] = (ad_real)(1 - f);
    w[1] = (ad_real)f;
}

AD__PRIVATE void ad__taps_free(ad__taps *t)
{
    AUTODIFF_FREE(t->idx);
    AUTODIFF_FREE(t->w);
    t->idx = NULL;
    t->w = NULL;
}

AD__PRIVATE int ad__taps_make(ad__taps *t, int in, int out)
{
    int i;
    t->ntaps = out < in ? (in + out - 1) / out + 1 : 2;
    t->idx = (int *)AUTODIFF_MALLOC((size_t)out * (size_t)t->ntaps * sizeof(int));
    t->w = (ad_real *)AUTODIFF_MALLOC((size_t)out * (size_t)t->ntaps * sizeof(ad_real));
    if (!t->idx || !t->w) {
        ad__taps_free(t);
        return -1;
    }
    for (i = 0; i < out; i++) {
        int *idx = t->idx + (size_t)i * (size_t)t->ntaps;
        ad_real *w = t->w + (size_t)i * (size_t)t->ntaps;
        if (out < in) ad__taps_area(in, out, i, t->ntaps, idx, w);
        else ad__taps_linear(in, out, i, idx, w);
    }
    return 0;
}

/* sum_k w[k] x[idx[k] * stride] for weights that are >= 0 and sum to 1, kept within the range
   of the values taken, where float rounding of the weights could step past it. */
AD__PRIVATE ad_real ad__taps_apply(const int *idx, const ad_real *w, int ntaps, const ad_real *x, size_t stride)
{
    ad_real s = 0, lo = x[(size_t)idx[0] * stride], hi = lo;
    int k;
    for (k = 0; k < ntaps; k++) {
        ad_real v = x[(size_t)idx[k] * stride];
        s += w[k] * v;
        if (w[k] > 0) {
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
    }
    return s < lo ? lo : (s > hi ? hi : s);
}

/* Resizes planes [c, h, w] to [c, oh, ow]: rows first into tmp [c, h, ow], then columns. */
AD__PRIVATE int ad__resize(const ad_real *src, int c, int h, int w, ad_real *dst, int oh, int ow)
{
    ad__taps tx, ty;
    size_t row, x, y, rows = (size_t)c * (size_t)h;
    ad_real *tmp = (size_t)ow > (size_t)-1 / sizeof(ad_real) / rows
                       ? NULL : (ad_real *)AUTODIFF_MALLOC(rows * (size_t)ow * sizeof(ad_real));
    int rc = -1;
    memset(&tx, 0, sizeof tx);
    memset(&ty, 0, sizeof ty);
    if (tmp && ad__taps_make(&tx, w, ow) == 0 && ad__taps_make(&ty, h, oh) == 0) {
        for (row = 0; row < rows; row++)
            for (x = 0; x < (size_t)ow; x++)
                tmp[row * (size_t)ow + x] = ad__taps_apply(tx.idx + x * (size_t)tx.ntaps, tx.w + x * (size_t)tx.ntaps,
                                                           tx.ntaps, src + row * (size_t)w, 1);
        for (row = 0; row < (size_t)c; row++)
            for (y = 0; y < (size_t)oh; y++)
                for (x = 0; x < (size_t)ow; x++)
                    dst[(row * (size_t)oh + y) * (size_t)ow + x] =
                        ad__taps_apply(ty.idx + y * (size_t)ty.ntaps, ty.w + y * (size_t)ty.ntaps, ty.ntaps,
                                       tmp + row * (size_t)h * (size_t)ow + x, (size_t)ow);
        rc = 0;
    }
    ad__taps_free(&tx);
    ad__taps_free(&ty);
    AUTODIFF_FREE(tmp);
    return rc;
}

AUTODIFF_API int ad_image_resize(const ad_image *src, int height, int width, ad_image *dst, char *err,
                                 size_t errlen)
{
    ad_image out;
    if (!dst) return ad__fail_into(err, errlen, "ad_image_resize: dst is NULL");
    if (!src || !src->data) {
        memset(dst, 0, sizeof *dst);
        return ad__fail_into(err, errlen, "ad_image_resize: no source image");
    }
    if (!ad__image_size_ok(src->channels, src->height, src->width)) {
        if (dst != src) memset(dst, 0, sizeof *dst);
        return ad__fail_into(err, errlen, "ad_image_resize: the source's size %dx%dx%d is not that of an image",
                             src->channels, src->height, src->width);
    }
    if (ad__image_alloc("ad_image_resize", &out, src->channels, height, width, err, errlen)) {
        if (dst != src) memset(dst, 0, sizeof *dst);
        return -1;
    }
    if (ad__resize(src->data, src->channels, src->height, src->width, out.data, height, width)) {
        ad_image_free(&out);
        if (dst != src) memset(dst, 0, sizeof *dst);
        return ad__fail_into(err, errlen, "ad_image_resize: out of memory");
    }
    if (dst == src) AUTODIFF_FREE(dst->data);
    *dst = out;
    return 0;
}

/* >>impl:data folders ------------------------------------------------------------------------ */
/* A growable list of strings the list owns. */
typedef struct ad__strlist {
    char **s;
    size_t n, cap;
} ad__strlist;

/* Appends s (taking it over; it is freed when the list cannot grow). 0, or -1 for no memory. */
AD__PRIVATE int ad__strlist_push(ad__strlist *l, char *s)
{
    if (!s) return -1;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        char **grown = (char **)AUTODIFF_REALLOC(l->s, cap * sizeof(char *));
        if (!grown) {
            AUTODIFF_FREE(s);
            return -1;
        }
        l->s = grown;
        l->cap = cap;
    }
    l->s[l->n++] = s;
    return 0;
}

AD__PRIVATE void ad__strlist_free(ad__strlist *l)
{
    size_t i;
    for (i = 0; i < l->n; i++) AUTODIFF_FREE(l->s[i]);
    AUTODIFF_FREE(l->s);
    memset(l, 0, sizeof *l);
}

AD__PRIVATE int ad__strcmp_ptr(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether name ends in an image extension stb_image reads (any letter case). */
AD__PRIVATE int ad__is_image_name(const char *name)
{
    static const char *const ext[] = {".png", ".jpg", ".jpeg", ".bmp"};
    size_t len = strlen(name), i, k;
    for (i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        size_t n = strlen(ext[i]);
        if (len <= n) continue;
        for (k = 0; k < n; k++) {
            char ch = name[len - n + k];
            if ((ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch) != ext[i][k]) break;
        }
        if (k == n) return 1;
    }
    return 0;
}

#if AD__HAS_DIRENT
/* The sorted names in dir of subfolders (want_dirs) or of image files, skipping names that
   start with '.'; appended to names. */
AD__PRIVATE int ad__list_dir(const char *dir, int want_dirs, ad__strlist *names, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t first = names->n;
    if (!d) return ad__fail_into(err, errlen, "%s: cannot open folder: %s", dir, strerror(errno));
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        char *path;
        int match;
        if (e->d_name[0] == '.' || (!want_dirs && !ad__is_image_name(e->d_name))) continue;
        path = ad__strdupf("%s/%s", dir, e->d_name);
        match = path && stat(path, &st) == 0 && (want_dirs ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode));
        if (!path || (match && ad__strlist_push(names, ad__strdupf("%s", e->d_name)))) {
            AUTODIFF_FREE(path);
            closedir(d);
            return ad__fail_into(err, errlen, "%s: out of memory listing the folder", dir);
        }
        AUTODIFF_FREE(path);
    }
    closedir(d);
    if (names->n > first) qsort(names->s + first, names->n - first, sizeof(char *), ad__strcmp_ptr);
    return 0;
}

/* Lists root's class folders into classes and their images (full paths) into files;
   ends[c] is the number of files of classes 0..c. */
AD__PRIVATE int ad__folder_scan(const char *root, ad__strlist *classes, ad__strlist *files, int **ends,
                                char *err, size_t errlen)
{
    size_t c, i;
    *ends = NULL;
    if (ad__list_dir(root, 1, classes, err, errlen)) return -1;
    if (classes->n == 0 || classes->n > (size_t)INT_MAX)
        return ad__fail_into(err, errlen, "%s: no class folders (expected %s/<class>/<image>.png)", root, root);
    *ends = (int *)AUTODIFF_MALLOC(classes->n * sizeof(int));
    if (!*ends) return ad__fail_into(err, errlen, "%s: out of memory", root);
    for (c = 0; c < classes->n; c++) {
        ad__strlist names;
        char *dir = ad__strdupf("%s/%s", root, classes->s[c]);
        int rc;
        memset(&names, 0, sizeof names);
        if (!dir) return ad__fail_into(err, errlen, "%s: out of memory", root);
        rc = ad__list_dir(dir, 0, &names, err, errlen);
        for (i = 0; rc == 0 && i < names.n; i++)
            if (ad__strlist_push(files, ad__strdupf("%s/%s", dir, names.s[i])))
                rc = ad__fail_into(err, errlen, "%s: out of memory", root);
        ad__strlist_free(&names);
        AUTODIFF_FREE(dir);
        if (rc) return -1;
        if (files->n > (size_t)INT_MAX) return ad__fail_into(err, errlen, "%s: too many images", root);
        (*ends)[c] = (int)files->n;
    }
    if (files->n == 0)
        return ad__fail_into(err, errlen, "%s: no images (.png, .jpg, .jpeg, .bmp) in the class folders", root);
    return 0;
}

/* Stores image im as sample k of ds, resizing it when resize is set. */
AD__PRIVATE int ad__folder_put(ad_dataset *ds, int k, const ad_image *im, int resize, const char *path,
                               char *err, size_t errlen)
{
    ad_real *dst = ds->x + (size_t)k * ds->sample_size;
    if (im->height == ds->shape[1] && im->width == ds->shape[2]) {
        memcpy(dst, im->data, ds->sample_size * sizeof(ad_real));
        return 0;
    }
    if (!resize)
        return ad__fail_into(err, errlen,
                             "%s: %dx%d pixels, but the first image has %dx%d (give ad_folder_load a height "
                             "and width to resize)", path, im->height, im->width, ds->shape[1], ds->shape[2]);
    if (ad__resize(im->data, im->channels, im->height, im->width, dst, ds->shape[1], ds->shape[2]))
        return ad__fail_into(err, errlen, "%s: out of memory resizing", path);
    return 0;
}

/* Decodes every file into ds; the label of file k is the class whose range in ends holds k. */
AD__PRIVATE int ad__folder_decode(const ad__strlist *files, const int *ends, int channels, int height,
                                  int width, ad_dataset *ds, char *err, size_t errlen)
{
    int k, label = 0;
    for (k = 0; k < (int)files->n; k++) {
        ad_image im;
        int rc = ad__image_file(files->s[k], channels, &im, err, errlen);
        if (rc == 0 && k == 0) {
            int shape[3];
            shape[0] = channels;
            shape[1] = height ? height : im.height;
            shape[2] = width ? width : im.width;
            rc = ad__dataset_alloc(ds, (int)files->n, 3, shape, 1, err, errlen);
        }
        if (rc == 0) rc = ad__folder_put(ds, k, &im, height > 0, files->s[k], err, errlen);
        ad_image_free(&im);
        if (rc) return -1;
        while (k >= ends[label]) label++;
        ds->labels[k] = label;
    }
    return 0;
}
#endif

AUTODIFF_API int ad_folder_load(const char *root, int channels, int height, int width, ad_dataset *ds,
                                char *err, size_t errlen)
{
#if AD__HAS_DIRENT && AD__HAS_STBI
    ad__strlist classes, files;
    int *ends = NULL, rc;
    char why[512];
    if (!ds) return ad__fail_into(err, errlen, "ad_folder_load: ds is NULL");
    memset(ds, 0, sizeof *ds);
    if (!root) return ad__fail_into(err, errlen, "ad_folder_load: root is NULL");
    if (channels < 1 || channels > 4)
        return ad__fail_into(err, errlen, "ad_folder_load: channels %d; use 1, 2, 3 or 4", channels);
    if (height < 0 || width < 0 || (height == 0) != (width == 0))
        return ad__fail_into(err, errlen, "ad_folder_load: height %d, width %d; give both (resize) or both 0",
                             height, width);
    memset(&classes, 0, sizeof classes);
    memset(&files, 0, sizeof files);
    rc = ad__folder_scan(root, &classes, &files, &ends, why, sizeof why);
    if (rc == 0) rc = ad__folder_decode(&files, ends, channels, height, width, ds, why, sizeof why);
    if (rc == 0) {
        ds->classes = (int)classes.n;
        ds->class_names = classes.s;
        memset(&classes, 0, sizeof classes);
    } else {
        ad_dataset_free(ds);
    }
    ad__strlist_free(&classes);
    ad__strlist_free(&files);
    AUTODIFF_FREE(ends);
    return rc ? ad__fail_into(err, errlen, "ad_folder_load: %s", why) : 0;
#else
    (void)root;
    (void)channels;
    (void)height;
    (void)width;
    if (ds) memset(ds, 0, sizeof *ds);
    return ad__fail_into(err, errlen, "%s",
                         AD__HAS_STBI ? "ad_folder_load: needs <dirent.h>, not available on this platform"
                                      : "ad_folder_load: to decode images, " AD__NEED_STB);
#endif
}

/* >>impl:data batches ------------------------------------------------------------------------ */
AUTODIFF_API int ad_batcher_init(ad_batcher *b, const ad_dataset *ds, int batch_size, int flags, uint64_t seed,
                                 char *err, size_t errlen)
{
    int i;
    if (!b) return ad__fail_into(err, errlen, "ad_batcher_init: b is NULL");
    memset(b, 0, sizeof *b);
    if (!ds || ds->count < 1 || !ds->x)
        return ad__fail_into(err, errlen, "ad_batcher_init: the dataset is empty");
    if (batch_size < 1)
        return ad__fail_into(err, errlen, "ad_batcher_init: batch_size %d; must be 1 or more", batch_size);
    if (flags & ~(AD_BATCH_SHUFFLE | AD_BATCH_DROP_LAST))
        return ad__fail_into(err, errlen, "ad_batcher_init: unknown flags 0x%x", (unsigned)flags);
    b->order = (int *)AUTODIFF_MALLOC((size_t)ds->count * sizeof(int));
    if (!b->order) return ad__fail_into(err, errlen, "ad_batcher_init: out of memory for %d indices", ds->count);
    for (i = 0; i < ds->count; i++) b->order[i] = i;
    b->ds = ds;
    b->count = ds->count;
    b->batch_size = batch_size;
    b->flags = flags;
    ad_rng_seed(&b->rng, seed);
    ad_batcher_reset(b);
    return 0;
}

AUTODIFF_API void ad_batcher_reset(ad_batcher *b)
{
    int i;
    if (!b || !b->order) return;
    b->pos = 0;
    b->epoch_rng = b->rng;
    if (!(b->flags & AD_BATCH_SHUFFLE)) return;
    for (i = 0; i < b->count; i++) b->order[i] = i;
    for (i = b->count - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)ad_rng_below(&b->rng, (uint64_t)i + 1), t = b->order[i];
        b->order[i] = b->order[j];
        b->order[j] = t;
    }
}

AUTODIFF_API int ad_batcher_next(ad_batcher *b, ad_real *x, int *labels)
{
    const ad_dataset *ds;
    size_t ss;
    int n, i;
    if (!b || !b->order) return 0;
    ds = b->ds;
    ss = ds->sample_size;
    n = b->count - b->pos < b->batch_size ? b->count - b->pos : b->batch_size;
    if (n <= 0 || ((b->flags & AD_BATCH_DROP_LAST) && n < b->batch_size)) return 0;
    for (i = 0; i < n; i++) {
        int s = b->order[b->pos + i];
        if (x) memcpy(x + (size_t)i * ss, ds->x + (size_t)s * ss, ss * sizeof(ad_real));
        if (labels && ds->labels) labels[i] = ds->labels[s];
    }
    b->pos += n;
    return n;
}

AUTODIFF_API void ad_batcher_free(ad_batcher *b)
{
    if (!b) return;
    AUTODIFF_FREE(b->order);
    memset(b, 0, sizeof *b);
}

#define AD__BATCHER_STATE_VERSION 1u

AUTODIFF_API void ad_batcher_get_state(const ad_batcher *b, unsigned char state[AD_BATCHER_STATE_BYTES])
{
    unsigned char *p = state;
    int k;
    if (!state) return;
    memset(state, 0, AD_BATCHER_STATE_BYTES);
    if (!b || !b->order) return;
    p = ad__ckpt_put32(p, AD__BATCHER_STATE_VERSION);
    p = ad__ckpt_put32(p, (uint32_t)b->count);
    p = ad__ckpt_put32(p, (uint32_t)b->batch_size);
    p = ad__ckpt_put32(p, (uint32_t)b->flags);
    p = ad__ckpt_put64(p, (uint64_t)b->pos);
    for (k = 0; k < 4; k++) p = ad__ckpt_put64(p, b->epoch_rng.s[k]);
}

AUTODIFF_API int ad_batcher_set_state(ad_batcher *b, const unsigned char *state, size_t len, char *err,
                                      size_t errlen)
{
    uint32_t count, batch_size, flags;
    uint64_t pos;
    int k;
    if (!b || !b->order) return ad__fail_into(err, errlen, "ad_batcher_set_state: the batcher is not initialised");
    if (!state || len != AD_BATCHER_STATE_BYTES || ad__ckpt_get32(state) != AD__BATCHER_STATE_VERSION)
        return ad__fail_into(err, errlen, "ad_batcher_set_state: not a batcher state (%zu bytes; "
                             "ad_batcher_get_state writes AD_BATCHER_STATE_BYTES, %d)", state ? len : 0,
                             AD_BATCHER_STATE_BYTES);
    count = ad__ckpt_get32(state + 4);
    batch_size = ad__ckpt_get32(state + 8);
    flags = ad__ckpt_get32(state + 12);
    pos = ad__ckpt_get64(state + 16);
    if (count != (uint32_t)b->count || batch_size != (uint32_t)b->batch_size || flags != (uint32_t)b->flags)
        return ad__fail_into(err, errlen, "ad_batcher_set_state: the state is of a batcher over %lu samples in "
                             "batches of %lu with flags %lu; this one has %d, %d and %d", (unsigned long)count,
                             (unsigned long)batch_size, (unsigned long)flags, b->count, b->batch_size, b->flags);
    if (pos > count)
        return ad__fail_into(err, errlen, "ad_batcher_set_state: position %llu is past the %lu samples",
                             (unsigned long long)pos, (unsigned long)count);
    for (k = 0; k < 4; k++) b->rng.s[k] = ad__ckpt_get64(state + 24 + 8 * k);
    ad_batcher_reset(b); /* the same order as then, drawn from the same state */
    b->pos = (int)pos;
    return 0;
}

#undef AD__BATCHER_STATE_VERSION

#undef AD__PRINTF
#undef AD__NEED_STB

#ifdef AD__POP_OPTIONS
#pragma GCC pop_options
#undef AD__POP_OPTIONS
#endif
#endif /* AUTODIFF_IMPLEMENTATION_DONE */
#endif /* AUTODIFF_IMPLEMENTATION */

/* >>license
------------------------------------------------------------------------------------------------
This software is available under 2 licenses -- choose whichever you prefer.
------------------------------------------------------------------------------------------------
ALTERNATIVE A - MIT License
Copyright (c) 2026 the autodiff.h authors
Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:
The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES
OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN
CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
------------------------------------------------------------------------------------------------
ALTERNATIVE B - Public Domain (www.unlicense.org)
This is free and unencumbered software released into the public domain.
Anyone is free to copy, modify, publish, use, compile, sell, or distribute this software, either in
source code form or as a compiled binary, for any purpose, commercial or non-commercial, and by any
means.
In jurisdictions that recognize copyright laws, the author or authors of this software dedicate any
and all copyright interest in the software to the public domain. We make this dedication for the
benefit of the public at large and to the detriment of our heirs and successors. We intend this
dedication to be an overt act of relinquishment in perpetuity of all present and future rights to
this software under copyright law.
------------------------------------------------------------------------------------------------
*/

// A 2-layer MLP (tanh hidden layer, linear output) on a synthetic regression set: small enough to
// train in a second, real enough that data-parallel training must match single-process training.
#ifndef ADAPTCOMM_EXAMPLES_MLP_H_
#define ADAPTCOMM_EXAMPLES_MLP_H_

#include <cstddef>
#include <vector>

namespace adaptcomm::examples {

struct Dataset {
  int inputs = 0;
  std::vector<float> x;  // samples x inputs, row-major
  std::vector<float> y;  // samples
  size_t samples() const { return y.size(); }
};

// Deterministic: every rank builds the same set from the same seed.
Dataset MakeRegressionSet(size_t samples, int inputs, unsigned seed);

class Mlp {
 public:
  Mlp(int inputs, int hidden, unsigned seed);
  // All parameters in one flat vector, so one allreduce moves every gradient.
  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }
  // Mean squared error over samples [begin, end) and its gradient (mean over those samples).
  double LossAndGradient(const Dataset& data, size_t begin, size_t end,
                         std::vector<float>& grad) const;
  void Step(const std::vector<float>& grad, float learning_rate);

 private:
  int inputs_, hidden_;
  std::vector<float> params_;  // w1 [hidden x inputs], b1 [hidden], w2 [hidden], b2 [1]
};

}  // namespace adaptcomm::examples

#endif  // ADAPTCOMM_EXAMPLES_MLP_H_

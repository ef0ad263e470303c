#include "examples/mlp.h"

#include <cmath>
#include <random>

namespace adaptcomm::examples {

Dataset MakeRegressionSet(size_t samples, int inputs, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> teacher(inputs);
  for (float& w : teacher) w = normal(rng) / std::sqrt(static_cast<float>(inputs));
  Dataset d;
  d.inputs = inputs;
  d.x.resize(samples * inputs);
  d.y.resize(samples);
  for (size_t s = 0; s < samples; ++s) {
    float dot = 0;
    for (int i = 0; i < inputs; ++i) {
      float v = normal(rng);
      d.x[s * inputs + i] = v;
      dot += v * teacher[i];
    }
    d.y[s] = std::sin(2.0f * dot) + 0.05f * normal(rng);
  }
  return d;
}

Mlp::Mlp(int inputs, int hidden, unsigned seed) : inputs_(inputs), hidden_(hidden) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  params_.resize(hidden * inputs + hidden + hidden + 1);
  for (int i = 0; i < hidden * inputs; ++i) params_[i] = normal(rng) / std::sqrt(float(inputs));
  for (int i = 0; i < hidden; ++i)
    params_[hidden * inputs + hidden + i] = normal(rng) / std::sqrt(float(hidden));
}

double Mlp::LossAndGradient(const Dataset& data, size_t begin, size_t end,
                            std::vector<float>& grad) const {
  const float* w1 = params_.data();
  const float* b1 = w1 + hidden_ * inputs_;
  const float* w2 = b1 + hidden_;
  const float b2 = w2[hidden_];
  std::vector<double> g(params_.size(), 0.0);
  double* gw1 = g.data();
  double* gb1 = gw1 + hidden_ * inputs_;
  double* gw2 = gb1 + hidden_;
  double& gb2 = gw2[hidden_];
  std::vector<double> h(hidden_);
  double loss = 0;
  for (size_t s = begin; s < end; ++s) {
    const float* x = &data.x[s * inputs_];
    double out = b2;
    for (int j = 0; j < hidden_; ++j) {
      double a = b1[j];
      for (int i = 0; i < inputs_; ++i) a += double(w1[j * inputs_ + i]) * x[i];
      h[j] = std::tanh(a);
      out += w2[j] * h[j];
    }
    double err = out - data.y[s];
    loss += err * err;
    double dout = 2 * err;
    gb2 += dout;
    for (int j = 0; j < hidden_; ++j) {
      gw2[j] += dout * h[j];
      double da = dout * w2[j] * (1 - h[j] * h[j]);
      gb1[j] += da;
      for (int i = 0; i < inputs_; ++i) gw1[j * inputs_ + i] += da * x[i];
    }
  }
  const double n = double(end - begin);
  grad.resize(params_.size());
  for (size_t k = 0; k < g.size(); ++k) grad[k] = static_cast<float>(g[k] / n);
  return loss / n;
}

void Mlp::Step(const std::vector<float>& grad, float learning_rate) {
  for (size_t k = 0; k < params_.size(); ++k) params_[k] -= learning_rate * grad[k];
}

}  // namespace adaptcomm::examples

// The op's config string (format: recurrent/op.py), parsed once per distinct string.
#pragma once

// CHECK_VALUE: a check whose failure Python sees as a ValueError. PyTorch's stable ABI (recurrent.cpp) raises
// RuntimeError only: its messages carry kValueError, which recurrent/op.py turns into a ValueError.
#ifdef TORCH_STABLE_ONLY
#include <torch/headeronly/util/Exception.h>
#define CHECK_VALUE(cond, ...) STD_TORCH_CHECK(cond, onnx2torch_rnn::kValueError, __VA_ARGS__)
#else
#include <c10/util/Exception.h>
#define CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, __VA_ARGS__)
#endif

#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "vec.h"

namespace onnx2torch_rnn {

constexpr const char* kValueError = "[ValueError] ";  // see CHECK_VALUE

enum class CellType { LSTM, GRU, RNN };

struct Config {
  CellType cell = CellType::LSTM;
  int gates = 4;  // LSTM i o f c, GRU z r h, RNN h: the ONNX gate order
  int roles = 3;  // activation functions per direction
  int64_t hidden_size = -1;  // the attribute; -1: R's last dimension
  int directions = 1;
  bool reverse = false;  // direction=reverse (a bidirectional node's second direction is always reversed)
  int layout = 0;
  std::vector<Activation> activations;  // ONNX attribute order: per direction, one per role
  bool has_clip = false;
  double clip = 0;
  bool input_forget = false, linear_before_reset = false;
  bool outputs[3] = {true, true, true};  // Y, Y_h, Y_c
  bool torch_weights = false;            // nn.LSTM/GRU/RNN flat weights, else the ONNX weights in `letters`
  std::string letters;
  int mask_output = -1;  // -1: the node takes no mask; 0: a masked step outputs zeros; 1: its previous output

  const Activation& activation(int direction, int role) const { return activations[direction * roles + role]; }
  bool reversed(int direction) const { return reverse || direction == 1; }
};

inline std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t end; (end = text.find(separator, start)) != std::string::npos; start = end + 1)
    parts.push_back(text.substr(start, end - start));
  parts.push_back(text.substr(start));
  return parts;
}

inline Activation parse_activation(const std::string& text) {
  static const std::map<std::string, Kind> kinds = {
      {"Relu", Kind::Relu}, {"Tanh", Kind::Tanh}, {"Sigmoid", Kind::Sigmoid}, {"Affine", Kind::Affine},
      {"LeakyRelu", Kind::LeakyRelu}, {"ThresholdedRelu", Kind::ThresholdedRelu}, {"ScaledTanh", Kind::ScaledTanh},
      {"HardSigmoid", Kind::HardSigmoid}, {"Elu", Kind::Elu}, {"Softsign", Kind::Softsign},
      {"Softplus", Kind::Softplus}};
  std::vector<std::string> parts = split(text, ':');
  auto found = kinds.find(parts[0]);
  CHECK_VALUE(found != kinds.end(), "unknown activation ", parts[0]);
  Activation activation;
  activation.kind = found->second;
  if (parts.size() > 1) activation.alpha = std::stod(parts[1]);
  if (parts.size() > 2) activation.beta = std::stod(parts[2]);
  return activation;
}

inline Config parse_config(const std::string& key) {
  std::map<std::string, std::string> fields;
  for (const std::string& item : split(key, ';')) {
    size_t equal = item.find('=');
    CHECK_VALUE(equal != std::string::npos, "bad recurrent config item: ", item);
    fields[item.substr(0, equal)] = item.substr(equal + 1);
  }
  Config c;
  const std::string& cell = fields.at("cell");
  CHECK_VALUE(cell == "LSTM" || cell == "GRU" || cell == "RNN", "unknown cell ", cell);
  c.cell = cell == "LSTM" ? CellType::LSTM : cell == "GRU" ? CellType::GRU : CellType::RNN;
  c.gates = c.cell == CellType::LSTM ? 4 : c.cell == CellType::GRU ? 3 : 1;
  c.roles = c.cell == CellType::LSTM ? 3 : c.cell == CellType::GRU ? 2 : 1;
  const auto hidden = fields.find("hidden_size");  // absent in programs saved before it was a key
  if (hidden != fields.end() && !hidden->second.empty()) c.hidden_size = std::stoll(hidden->second);
  c.directions = fields.at("direction") == "bidirectional" ? 2 : 1;
  c.reverse = fields.at("direction") == "reverse";
  c.layout = std::stoi(fields.at("layout"));
  for (const std::string& a : split(fields.at("activations"), ',')) c.activations.push_back(parse_activation(a));
  CHECK_VALUE(static_cast<int>(c.activations.size()) == c.roles * c.directions, "recurrent config: ",
              c.roles * c.directions, " activations expected");
  c.has_clip = !fields.at("clip").empty();
  if (c.has_clip) c.clip = std::stod(fields.at("clip"));
  c.input_forget = fields.at("input_forget") == "1";
  c.linear_before_reset = fields.at("linear_before_reset") == "1";
  const std::string& outputs = fields.at("outputs");
  for (int k = 0; k < 3; ++k) c.outputs[k] = outputs.at(k) == '1';
  c.torch_weights = fields.at("weights") == "torch";
  c.letters = c.torch_weights ? "" : fields.at("weights");
  const std::string& mask = fields.at("mask_output");
  c.mask_output = mask.empty() ? -1 : mask == "hold" ? 1 : 0;
  return c;
}

// One parse per distinct string: the op is called with the same few strings over and over.
inline const Config& config_of(std::string_view key) {
  static std::mutex mutex;
  static std::map<std::string, Config, std::less<>> parsed;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = parsed.find(key);
  if (found == parsed.end()) {
    std::string text(key);
    found = parsed.emplace(text, parse_config(text)).first;
  }
  return found->second;
}

// Configs by number (the op recurrent_config's): a string that crosses PyTorch's stable ABI is copied twice per
// call, a number is not. Each distinct string parsed once, numbered from 0.
class NumberedConfigs {
 public:
  static NumberedConfigs& get() {
    static NumberedConfigs configs;
    return configs;
  }
  int64_t number(std::string_view key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = numbers_.find(key);
    if (found == numbers_.end()) {
      std::string text(key);
      configs_.push_back(parse_config(text));
      found = numbers_.emplace(text, static_cast<int64_t>(configs_.size()) - 1).first;
    }
    return found->second;
  }
  const Config& at(int64_t number) {
    std::lock_guard<std::mutex> lock(mutex_);
    CHECK_VALUE(number >= 0 && number < static_cast<int64_t>(configs_.size()), "recurrent op: no config ", number);
    return configs_[number];  // a deque: a later push_back moves no element
  }

 private:
  std::mutex mutex_;
  std::map<std::string, int64_t, std::less<>> numbers_;
  std::deque<Config> configs_;
};

}  // namespace onnx2torch_rnn

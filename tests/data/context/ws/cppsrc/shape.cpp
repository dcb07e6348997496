#include <vector>
#include "shape.hpp"

namespace geo {

class Circle {
 public:
  explicit Circle(double r) : radius_(r) {}
  double area() const { return 3.14159 * radius_ * radius_; }

 private:
  double radius_;
};

double total(const std::vector<Circle>& circles) {
  double sum = 0;
  for (const auto& c : circles) sum += c.area();
  return sum;
}

}  // namespace geo

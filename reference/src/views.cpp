// Element access of the reference's strided views.
#include "openmla_ref/attention.h"
#include "openmla_ref/numeric.h"

namespace openmla::ref {

double RealView::load(int64_t offset) const {
  switch (type) {
    case ElemType::kFloat32: return static_cast<const float*>(data)[offset];
    case ElemType::kFloat64: return static_cast<const double*>(data)[offset];
    case ElemType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(data)[offset]);
    case ElemType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(data)[offset]);
  }
  return 0.0;
}

}  // namespace openmla::ref

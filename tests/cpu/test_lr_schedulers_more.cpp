// optim/: the schedulers added after StepLR/LinearLR/CosineAnnealingLR (MultiStepLR,
// ExponentialLR, OneCycleLR, CosineAnnealingWarmRestarts, ReduceLROnPlateau) against the lr
// sequences PyTorch gives for two param groups with different base lrs, alone and chained;
// a resume through the state dict in the middle of each run; option validation; OneCycleLR's
// error past the end of its cycle.
//
// The expected arrays are the output of this script (torch 1.13 was run; for these
// schedulers 2.x has the same formulas: MultiStepLR's Counter and closed form, ExponentialLR,
// CosineAnnealingWarmRestarts' T_cur/T_i recursion (2.x restarts with T_cur % T_i where 1.13
// has T_cur - T_i, the same when stepping by one), OneCycleLR's phases and anneals, and
// ReduceLROnPlateau's step and is_better. The only difference met is OneCycleLR's error
// text past the end, "Tried to step {step_num + 1} times" in 1.13 and "{step_num}" in 2.x;
// the check below asks for neither count):
//
//   import math, torch
//   from torch.optim import SGD, lr_scheduler as L
//
//   def opt():
//       return SGD([{'params': [torch.zeros(1, requires_grad=True)]},
//                   {'params': [torch.zeros(1, requires_grad=True)], 'lr': 0.5}], lr=0.1)
//
//   def run(make, n, metric=None):  # the lrs of epochs 0 .. n-1
//       o = opt(); s = make(o); out = [[], []]
//       s = s if isinstance(s, tuple) else (s,)
//       for k in range(n):
//           for g in range(2): out[g].append(o.param_groups[g]['lr'])
//           if k + 1 < n:
//               o.step()
//               for x in s: x.step() if metric is None else x.step(metric(k))
//       return out
//
//   def metric(k): return float('nan') if k == 30 else 1.0 / (1 + k // 6) + 0.05 * (k % 4)
//
//   cases = {
//     'multistep': run(lambda o: L.MultiStepLR(o, milestones=[12, 5, 20, 20], gamma=0.5), 40),
//     'exponential': run(lambda o: L.ExponentialLR(o, gamma=0.9), 40),
//     'onecycle_cos': run(lambda o: L.OneCycleLR(o, max_lr=[0.1, 0.5], total_steps=40, cycle_momentum=False), 41),
//     'onecycle_linear3': run(lambda o: L.OneCycleLR(o, max_lr=[0.2, 0.6], total_steps=30, pct_start=0.25,
//         anneal_strategy='linear', div_factor=10.0, final_div_factor=100.0, three_phase=True,
//         cycle_momentum=False), 31),
//     'warm_restarts': run(lambda o: L.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=0.01), 50),
//     'warm_restarts_1': run(lambda o: L.CosineAnnealingWarmRestarts(o, T_0=7), 30),
//     # two schedulers stepped on one optimizer, in this order
//     'chained_exp_multistep': run(lambda o: (L.ExponentialLR(o, gamma=0.9),
//                                             L.MultiStepLR(o, milestones=[5, 12], gamma=0.5)), 30),
//     'chained_exp_restarts': run(lambda o: (L.ExponentialLR(o, gamma=0.9),
//                                            L.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2)), 30),
//     'plateau_min': run(lambda o: L.ReduceLROnPlateau(o, mode='min', factor=0.5, patience=2, threshold=0.1,
//         cooldown=1, min_lr=[0.01, 0.05]), 40, metric),
//     'plateau_max': run(lambda o: L.ReduceLROnPlateau(o, mode='max', factor=0.3, patience=1, threshold=0.02,
//         threshold_mode='abs', min_lr=0.001), 40, lambda k: 1.0 - metric(k)),
//   }
//   for name, (a, b) in cases.items():
//       print(f"const LRs {name} = {{")
//       for v in (a, b): print("    {" + ", ".join(repr(x) for x in v) + "},")
//       print("};")
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "optim/lr_scheduler.h"
#include "optim/lr_scheduler_plateau.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using namespace frugal::optim;

namespace {

/// lrs[g][t]: group g's lr at epoch t.
using LRs = std::vector<std::vector<double>>;

// clang-format off
const LRs multistep = {
    {0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025, 0.025, 0.025, 0.025, 0.025, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625},
    {0.5, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125, 0.03125},
};
const LRs exponential = {
    {0.1, 0.09000000000000001, 0.08100000000000002, 0.07290000000000002, 0.06561000000000002, 0.05904900000000002, 0.05314410000000002, 0.04782969000000002, 0.043046721000000024, 0.03874204890000002, 0.03486784401000002, 0.03138105960900001, 0.028242953648100012, 0.025418658283290013, 0.022876792454961013, 0.020589113209464913, 0.01853020188851842, 0.01667718169966658, 0.015009463529699923, 0.013508517176729932, 0.01215766545905694, 0.010941898913151246, 0.009847709021836121, 0.00886293811965251, 0.007976644307687259, 0.007178979876918534, 0.006461081889226681, 0.005814973700304013, 0.005233476330273611, 0.00471012869724625, 0.004239115827521626, 0.0038152042447694634, 0.003433683820292517, 0.0030903154382632653, 0.002781283894436939, 0.002503155504993245, 0.0022528399544939205, 0.0020275559590445286, 0.0018248003631400759, 0.0016423203268260682},
    {0.5, 0.45, 0.405, 0.36450000000000005, 0.32805000000000006, 0.2952450000000001, 0.2657205000000001, 0.23914845000000007, 0.21523360500000008, 0.19371024450000007, 0.17433922005000008, 0.15690529804500009, 0.14121476824050008, 0.12709329141645007, 0.11438396227480506, 0.10294556604732455, 0.0926510094425921, 0.08338590849833288, 0.0750473176484996, 0.06754258588364964, 0.06078832729528468, 0.05470949456575622, 0.0492385451091806, 0.04431469059826254, 0.039883221538436285, 0.03589489938459266, 0.032305409446133394, 0.029074868501520055, 0.02616738165136805, 0.023550643486231246, 0.021195579137608122, 0.01907602122384731, 0.01716841910146258, 0.015451577191316321, 0.01390641947218469, 0.012515777524966222, 0.0112641997724696, 0.010137779795222639, 0.009124001815700375, 0.008211601634130337},
};
const LRs onecycle_cos = {
    {0.0040000000000000036, 0.005944337266504118, 0.011619830424103306, 0.020566684770626315, 0.03206007937590945, 0.04516888776288231, 0.058831112237117685, 0.07193992062409055, 0.08343331522937368, 0.0923801695758967, 0.09805566273349588, 0.1, 0.09968561175222017, 0.09874640062350874, 0.09719417773875232, 0.09504846320134738, 0.09233624061657436, 0.089091617757105, 0.08535539763797113, 0.0811745653949763, 0.07660169741935154, 0.07169430017913009, 0.06651408704194597, 0.06112620219362893, 0.055598401412270175, 0.0500002, 0.04440199858772983, 0.03887419780637107, 0.03348631295805405, 0.028306099820869922, 0.023398702580648485, 0.0188258346050237, 0.014645002362028864, 0.010908782242895003, 0.0076641593834256404, 0.004951936798652629, 0.002806222261247683, 0.0012539993764912555, 0.0003147882477798485, 4e-07, 0.000314788247779854},
    {0.020000000000000018, 0.029721686332520647, 0.05809915212051653, 0.10283342385313154, 0.16030039687954722, 0.22584443881441152, 0.2941555611855884, 0.3596996031204527, 0.4171665761468684, 0.4619008478794835, 0.4902783136674793, 0.5, 0.4984280587611008, 0.49373200311754367, 0.4859708886937616, 0.47524231600673683, 0.4616812030828718, 0.445458088785525, 0.42677698818985565, 0.40587282697488153, 0.3830084870967576, 0.3584715008956504, 0.33257043520972984, 0.30563101096814466, 0.27799200706135085, 0.250001, 0.22200999293864915, 0.19437098903185537, 0.16743156479027027, 0.14153049910434962, 0.1169935129032424, 0.09412917302511849, 0.07322501181014432, 0.05454391121447502, 0.0383207969171282, 0.024759683993263143, 0.014031111306238415, 0.006269996882456277, 0.0015739412388992423, 2e-06, 0.00157394123889927},
};
const LRs onecycle_linear3 = {
    {0.02, 0.0476923076923077, 0.0753846153846154, 0.1030769230769231, 0.13076923076923078, 0.1584615384615385, 0.18615384615384617, 0.18615384615384617, 0.15846153846153846, 0.13076923076923075, 0.10307692307692308, 0.07538461538461538, 0.0476923076923077, 0.01999999999999999, 0.0187625, 0.017525, 0.0162875, 0.015050000000000001, 0.0138125, 0.012575, 0.0113375, 0.0101, 0.008862499999999999, 0.007625, 0.006387499999999999, 0.005149999999999998, 0.003912499999999999, 0.0026750000000000003, 0.0014374999999999978, 0.0001999999999999988, -0.0010375000000000002},
    {0.06, 0.1430769230769231, 0.22615384615384618, 0.30923076923076925, 0.39230769230769236, 0.4753846153846154, 0.5584615384615386, 0.5584615384615385, 0.47538461538461535, 0.39230769230769225, 0.3092307692307692, 0.2261538461538461, 0.14307692307692305, 0.05999999999999994, 0.0562875, 0.052575, 0.0488625, 0.045149999999999996, 0.0414375, 0.037725, 0.0340125, 0.0303, 0.0265875, 0.022875, 0.0191625, 0.015450000000000005, 0.011737500000000005, 0.008025000000000004, 0.004312500000000004, 0.0006000000000000033, -0.0031124999999999903},
};
const LRs warm_restarts = {
    {0.1, 0.09140576474687263, 0.06890576474687264, 0.04109423525312737, 0.01859423525312737, 0.1, 0.09779754323328192, 0.09140576474687263, 0.08145033635316129, 0.06890576474687264, 0.05500000000000001, 0.04109423525312737, 0.028549663646838717, 0.01859423525312737, 0.012202456766718092, 0.1, 0.0994459753267812, 0.09779754323328192, 0.09509529358847656, 0.09140576474687263, 0.08681980515339464, 0.08145033635316129, 0.07542957248827961, 0.06890576474687264, 0.0620395509268104, 0.05500000000000001, 0.04796044907318963, 0.04109423525312737, 0.034570427511720396, 0.028549663646838717, 0.023180194846605363, 0.01859423525312737, 0.014904706411523451, 0.012202456766718092, 0.010554024673218806, 0.1, 0.09986128001799077, 0.0994459753267812, 0.09875664641789544, 0.09779754323328192, 0.0965745789630079, 0.09509529358847656, 0.09336880739593416, 0.09140576474687263, 0.0892182684520014, 0.08681980515339464, 0.08422516217485827, 0.08145033635316129, 0.0785124354122177, 0.07542957248827961},
    {0.5, 0.45320916362186214, 0.33070916362186215, 0.17929083637813792, 0.0567908363781379, 0.5, 0.48800884649231263, 0.45320916362186214, 0.39900738681165593, 0.33070916362186215, 0.255, 0.17929083637813792, 0.11099261318834411, 0.0567908363781379, 0.021991153507687385, 0.5, 0.49698364344580875, 0.48800884649231263, 0.47329659842615013, 0.45320916362186214, 0.4282411613907041, 0.39900738681165593, 0.366227672436189, 0.33070916362186215, 0.2933264439348566, 0.255, 0.2166735560651435, 0.17929083637813792, 0.14377232756381106, 0.11099261318834411, 0.08175883860929586, 0.0567908363781379, 0.036703401573849895, 0.021991153507687385, 0.013016356554191274, 0.5, 0.4992447467646164, 0.49698364344580875, 0.49323063049743077, 0.48800884649231263, 0.48135048546526527, 0.47329659842615013, 0.4638968402667526, 0.45320916362186214, 0.4412994615720076, 0.4282411613907041, 0.41411477184089507, 0.39900738681165593, 0.3830121483554075, 0.366227672436189},
};
const LRs warm_restarts_1 = {
    {0.1, 0.09504844339512096, 0.08117449009293669, 0.06112604669781572, 0.03887395330218429, 0.018825509907063328, 0.004951556604879049, 0.1, 0.09504844339512096, 0.08117449009293669, 0.06112604669781572, 0.03887395330218429, 0.018825509907063328, 0.004951556604879049, 0.1, 0.09504844339512096, 0.08117449009293669, 0.06112604669781572, 0.03887395330218429, 0.018825509907063328, 0.004951556604879049, 0.1, 0.09504844339512096, 0.08117449009293669, 0.06112604669781572, 0.03887395330218429, 0.018825509907063328, 0.004951556604879049, 0.1, 0.09504844339512096},
    {0.5, 0.47524221697560476, 0.4058724504646834, 0.3056302334890786, 0.19436976651092142, 0.09412754953531663, 0.02475778302439524, 0.5, 0.47524221697560476, 0.4058724504646834, 0.3056302334890786, 0.19436976651092142, 0.09412754953531663, 0.02475778302439524, 0.5, 0.47524221697560476, 0.4058724504646834, 0.3056302334890786, 0.19436976651092142, 0.09412754953531663, 0.02475778302439524, 0.5, 0.47524221697560476, 0.4058724504646834, 0.3056302334890786, 0.19436976651092142, 0.09412754953531663, 0.02475778302439524, 0.5, 0.47524221697560476},
};
const LRs chained_exp_multistep = {
    {0.1, 0.09000000000000001, 0.08100000000000002, 0.07290000000000002, 0.06561000000000002, 0.02952450000000001, 0.02657205000000001, 0.02391484500000001, 0.021523360500000012, 0.01937102445000001, 0.01743392200500001, 0.015690529804500006, 0.007060738412025003, 0.006354664570822503, 0.005719198113740253, 0.005147278302366228, 0.004632550472129605, 0.004169295424916645, 0.003752365882424981, 0.003377129294182483, 0.003039416364764235, 0.0027354747282878115, 0.0024619272554590303, 0.0022157345299131273, 0.0019941610769218148, 0.0017947449692296334, 0.0016152704723066701, 0.0014537434250760032, 0.0013083690825684028, 0.0011775321743115626},
    {0.5, 0.45, 0.405, 0.36450000000000005, 0.32805000000000006, 0.14762250000000005, 0.13286025000000004, 0.11957422500000003, 0.10761680250000004, 0.09685512225000004, 0.08716961002500004, 0.07845264902250004, 0.03530369206012502, 0.031773322854112517, 0.028595990568701265, 0.025736391511831137, 0.023162752360648024, 0.02084647712458322, 0.0187618294121249, 0.01688564647091241, 0.01519708182382117, 0.013677373641439054, 0.01230963627729515, 0.011078672649565635, 0.009970805384609071, 0.008973724846148164, 0.008076352361533349, 0.007268717125380014, 0.0065418454128420124, 0.0058876608715578115},
};
const LRs chained_exp_restarts = {
    {0.1, 0.09045084971874738, 0.06545084971874737, 0.03454915028125263, 0.009549150281252633, 0.1, 0.09755282581475769, 0.09045084971874738, 0.07938926261462366, 0.06545084971874737, 0.05, 0.03454915028125263, 0.02061073738537635, 0.009549150281252633, 0.0024471741852423235, 0.1, 0.0993844170297569, 0.09755282581475769, 0.09455032620941839, 0.09045084971874738, 0.08535533905932738, 0.07938926261462366, 0.07269952498697733, 0.06545084971874737, 0.05782172325201155, 0.05, 0.04217827674798847, 0.03454915028125263, 0.027300475013022664, 0.02061073738537635},
    {0.5, 0.45225424859373686, 0.32725424859373686, 0.17274575140626316, 0.047745751406263165, 0.5, 0.4877641290737884, 0.45225424859373686, 0.3969463130731183, 0.32725424859373686, 0.25, 0.17274575140626316, 0.10305368692688174, 0.047745751406263165, 0.012235870926211617, 0.5, 0.49692208514878444, 0.4877641290737884, 0.47275163104709195, 0.45225424859373686, 0.42677669529663687, 0.3969463130731183, 0.3634976249348867, 0.32725424859373686, 0.28910861626005774, 0.25, 0.21089138373994235, 0.17274575140626316, 0.1365023750651133, 0.10305368692688174},
};
const LRs plateau_min = {
    {0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025, 0.0125, 0.0125, 0.0125, 0.0125, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01},
    {0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.125, 0.125, 0.125, 0.125, 0.0625, 0.0625, 0.0625, 0.0625, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05},
};
const LRs plateau_max = {
    {0.1, 0.1, 0.1, 0.03, 0.03, 0.009, 0.009, 0.009, 0.009, 0.009, 0.009, 0.0026999999999999997, 0.0026999999999999997, 0.0026999999999999997, 0.0026999999999999997, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001},
    {0.5, 0.5, 0.5, 0.15, 0.15, 0.045, 0.045, 0.045, 0.045, 0.045, 0.045, 0.0135, 0.0135, 0.0135, 0.0135, 0.00405, 0.00405, 0.001215, 0.001215, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001, 0.001},
};
// clang-format on

/// The two groups of the script: lr 0.1 and lr 0.5.
struct TwoGroups {
  std::vector<Tensor> a{make_tensor({0.0}, {1}, kFloat64).requires_grad_()};
  std::vector<Tensor> b{make_tensor({0.0}, {1}, kFloat64).requires_grad_()};
  SGD opt{std::vector<ParamGroup>{{.params = a}, {.params = b, .lr = 0.5}}, {.lr = 0.1}};
};

double metric(int64_t k) {
  return k == 30 ? std::numeric_limits<double>::quiet_NaN() : 1.0 / double(1 + k / 6) + 0.05 * double(k % 4);
}

/// Checks epochs [from, expected size) of `expected` against the optimizer's lrs, calling
/// `step(k)` between epoch k and k + 1. PyTorch's steps are recursive (lr *= gamma), frugal's
/// closed: the last bits may differ.
void check_run(Optimizer& opt, const LRs& expected, const std::function<void(int64_t)>& step, int64_t from = 0) {
  const int64_t n = int64_t(expected[0].size());
  for (int64_t t = from; t < n; ++t) {
    CAPTURE(t);
    for (size_t g = 0; g < 2; ++g) {
      CAPTURE(g);
      CHECK(opt.param_groups()[g].lr == doctest::Approx(expected[g][size_t(t)]).epsilon(1e-13));
    }
    if (t + 1 < n) step(t);
  }
}

/// Runs `make`'s scheduler `k` steps, saves it, makes a fresh optimizer and scheduler, loads
/// the dict, and checks that the resumed run gives the rest of `expected`.
template <typename Make>
void check_resume(const LRs& expected, int64_t k, Make make) {
  TwoGroups first;
  auto sched = make(first.opt);
  for (int64_t t = 0; t < k; ++t) sched->step();
  const StateDict saved = sched->state_dict();
  TwoGroups second;
  auto resumed = make(second.opt);
  resumed->step();  // somewhere else: the load puts it back
  resumed->load_state_dict(saved);
  CHECK(resumed->last_epoch() == k);
  CHECK(second.opt.param_groups()[0].lr == first.opt.param_groups()[0].lr);
  CHECK(second.opt.param_groups()[1].lr == first.opt.param_groups()[1].lr);
  check_run(
      second.opt, expected, [&](int64_t) { resumed->step(); }, k);
}

}  // namespace

TEST_CASE("LR schedulers: MultiStepLR and ExponentialLR match PyTorch per group") {
  {
    TwoGroups m;
    MultiStepLR sched(m.opt, {.milestones = {12, 5, 20, 20}, .gamma = 0.5});  // sorted; 20 twice: gamma^2 there
    check_run(m.opt, multistep, [&](int64_t) {
      sched.step();
      CHECK(sched.last_lr() == std::vector<double>{m.opt.param_groups()[0].lr, m.opt.param_groups()[1].lr});
    });
    CHECK(sched.schedule() == "MultiStepLR(milestones=[5, 12, 20, 20], gamma=0.5)");
    CHECK(sched.base_lrs() == std::vector<double>{0.1, 0.5});
  }
  {
    TwoGroups m;
    ExponentialLR sched(m.opt, {.gamma = 0.9});
    check_run(m.opt, exponential, [&](int64_t) { sched.step(); });
  }
  check_resume(multistep, 13, [](Optimizer& o) {
    return std::make_unique<MultiStepLR>(o, MultiStepLROptions{.milestones = {12, 5, 20, 20}, .gamma = 0.5});
  });
  check_resume(exponential, 17,
               [](Optimizer& o) { return std::make_unique<ExponentialLR>(o, ExponentialLROptions{.gamma = 0.9}); });
}

TEST_CASE("LR schedulers: chained with others as in PyTorch; warm restarts are not chainable") {
  {
    TwoGroups m;
    ExponentialLR exp(m.opt, {.gamma = 0.9});
    MultiStepLR ms(m.opt, {.milestones = {5, 12}, .gamma = 0.5});
    check_run(m.opt, chained_exp_multistep, [&](int64_t) {
      exp.step();
      ms.step();
    });
  }
  {
    TwoGroups m;
    ExponentialLR exp(m.opt, {.gamma = 0.9});
    CosineAnnealingWarmRestarts sgdr(m.opt, {.T_0 = 5, .T_mult = 2});
    check_run(m.opt, chained_exp_restarts, [&](int64_t) {
      exp.step();
      sgdr.step();  // overwrites what ExponentialLR set
    });
  }
}

TEST_CASE("LR schedulers: CosineAnnealingWarmRestarts matches PyTorch per group") {
  {
    TwoGroups m;
    CosineAnnealingWarmRestarts sched(m.opt, {.T_0 = 5, .T_mult = 2, .eta_min = 0.01});
    check_run(m.opt, warm_restarts, [&](int64_t) { sched.step(); });
  }
  {
    TwoGroups m;
    CosineAnnealingWarmRestarts sched(m.opt, {.T_0 = 7});
    check_run(m.opt, warm_restarts_1, [&](int64_t) { sched.step(); });
  }
  check_resume(warm_restarts, 22, [](Optimizer& o) {
    return std::make_unique<CosineAnnealingWarmRestarts>(
        o, CosineAnnealingWarmRestartsOptions{.T_0 = 5, .T_mult = 2, .eta_min = 0.01});
  });
  {  // far epochs: the integer cycle count agrees with the geometric series
    TwoGroups m;
    CosineAnnealingWarmRestarts sched(m.opt, {.T_0 = 3, .T_mult = 3});
    // cycles of 3, 9, 27, 81, 243: the fifth starts at 120, so epoch 120 + 81 is T_cur 81 of 243
    const double expected = 0.1 * (1 + std::cos(std::numbers::pi * 81.0 / 243.0)) / 2;
    CHECK(sched.lr_at(0.1, 120 + 81) == doctest::Approx(expected).epsilon(1e-15));
    CHECK(sched.lr_at(0.1, 120) == 0.1);
    CHECK(sched.lr_at(0.1, 119) == doctest::Approx(0.1 * (1 + std::cos(std::numbers::pi * 80.0 / 81.0)) / 2));
  }
}

TEST_CASE("LR schedulers: OneCycleLR matches PyTorch, and refuses to step past its end") {
  {
    TwoGroups m;
    OneCycleLR sched(m.opt, {.max_lr = {0.1, 0.5}, .total_steps = 40});
    CHECK(*m.opt.param_groups()[0].initial_lr == 0.1 / 25);  // the base is max_lr / div_factor, as PyTorch's
    CHECK(*m.opt.param_groups()[1].initial_lr == 0.5 / 25);
    check_run(m.opt, onecycle_cos, [&](int64_t) { sched.step(); });
    REQUIRE(sched.last_epoch() == 40);  // step total_steps is allowed, as in PyTorch
    const std::vector<double> at_end = sched.last_lr();
    check_error([&] { sched.step(); }, {"OneCycleLR", "41", "total_steps 40"});
    CHECK(sched.last_epoch() == 40);  // nothing changed
    CHECK(sched.last_lr() == at_end);
    CHECK(m.opt.param_groups()[1].lr == at_end[1]);
    // nor does a dict past the end load
    StateDict past = sched.state_dict();
    past[0].second = scalar_tensor(41.0, TensorOptions(kInt64));
    check_error([&] { sched.load_state_dict(past); }, {"OneCycleLR", "total_steps"});
    CHECK(sched.last_epoch() == 40);
  }
  {
    TwoGroups m;
    OneCycleLR sched(m.opt, {.max_lr = {0.2, 0.6},
                             .total_steps = 30,
                             .pct_start = 0.25,
                             .anneal_strategy = AnnealStrategy::Linear,
                             .div_factor = 10,
                             .final_div_factor = 100,
                             .three_phase = true});
    check_run(m.opt, onecycle_linear3, [&](int64_t) { sched.step(); });
    check_error([&] { sched.step(); }, {"OneCycleLR", "total_steps 30"});
  }
  {  // one max_lr for every group: PyTorch's scalar max_lr
    TwoGroups m;
    OneCycleLR sched(m.opt, {.max_lr = {0.5}, .total_steps = 10});
    CHECK(m.opt.param_groups()[0].lr == m.opt.param_groups()[1].lr);
  }
  check_resume(onecycle_cos, 15, [](Optimizer& o) {
    return std::make_unique<OneCycleLR>(o, OneCycleLROptions{.max_lr = {0.1, 0.5}, .total_steps = 40});
  });
  {  // another cycle length is refused on load (Note [A checkpoint names its schedule])
    TwoGroups m, n;
    OneCycleLR a(m.opt, {.max_lr = {0.1, 0.5}, .total_steps = 40});
    OneCycleLR b(n.opt, {.max_lr = {0.1, 0.5}, .total_steps = 50});
    check_error([&] { b.load_state_dict(a.state_dict()); }, {"OneCycleLR(max_lr=[0.1, 0.5]", "total_steps=40"});
  }
}

TEST_CASE("LR schedulers: ReduceLROnPlateau matches PyTorch and resumes from its state dict") {
  const ReduceLROnPlateauOptions min_options{
      .factor = 0.5, .patience = 2, .threshold = 0.1, .cooldown = 1, .min_lr = {0.01, 0.05}};
  const ReduceLROnPlateauOptions max_options{.mode = PlateauMode::Max,
                                             .factor = 0.3,
                                             .patience = 1,
                                             .threshold = 0.02,
                                             .threshold_mode = ThresholdMode::Abs,
                                             .min_lr = {0.001}};
  {
    TwoGroups m;
    ReduceLROnPlateau sched(m.opt, min_options);
    CHECK(sched.best() == std::numeric_limits<double>::infinity());
    check_run(m.opt, plateau_min, [&](int64_t k) {
      sched.step(metric(k));
      CHECK(sched.last_lr() == std::vector<double>{m.opt.param_groups()[0].lr, m.opt.param_groups()[1].lr});
    });
    CHECK(sched.last_epoch() == 39);
  }
  {
    TwoGroups m;
    ReduceLROnPlateau sched(m.opt, max_options);
    check_run(m.opt, plateau_max, [&](int64_t k) { sched.step(1.0 - metric(k)); });
  }
  // resume mid-run, mid-cooldown and with bad epochs counted: a fresh optimizer (lrs 0.1 and
  // 0.5) and scheduler given the dict go on as the uninterrupted run
  for (int64_t k : {5, 13, 16, 17}) {
    CAPTURE(k);
    TwoGroups first;
    ReduceLROnPlateau sched(first.opt, min_options);
    for (int64_t t = 0; t < k; ++t) sched.step(metric(t));
    TwoGroups second;
    ReduceLROnPlateau resumed(second.opt, min_options);
    resumed.load_state_dict(sched.state_dict());
    CHECK(resumed.last_epoch() == k);
    CHECK(resumed.best() == sched.best());
    CHECK(resumed.num_bad_epochs() == sched.num_bad_epochs());
    CHECK(resumed.cooldown_counter() == sched.cooldown_counter());
    check_run(
        second.opt, plateau_min, [&](int64_t t) { resumed.step(metric(t)); }, k);
  }
  {
    TwoGroups first;
    ReduceLROnPlateau sched(first.opt, max_options);
    for (int64_t t = 0; t < 4; ++t) sched.step(1.0 - metric(t));
    TwoGroups second;
    ReduceLROnPlateau resumed(second.opt, max_options);
    resumed.load_state_dict(sched.state_dict());
    check_run(
        second.opt, plateau_max, [&](int64_t t) { resumed.step(1.0 - metric(t)); }, 4);
    // refused, changing nothing: other settings, a missing key, an unexpected one
    ReduceLROnPlateau other(second.opt, min_options);
    check_error([&] { other.load_state_dict(sched.state_dict()); }, {"ReduceLROnPlateau", "mode=max", "mode=min"});
    StateDict missing = sched.state_dict();
    missing.erase(missing.begin() + 3);  // best
    check_error([&] { resumed.load_state_dict(missing); }, {"ReduceLROnPlateau", "best"});
    StateDict extra = sched.state_dict();
    extra.emplace_back("momentum", scalar_tensor(0.0));
    check_error([&] { resumed.load_state_dict(extra); }, {"ReduceLROnPlateau", "unexpected key 'momentum'"});
    CHECK(resumed.last_epoch() == 39);
  }
}

TEST_CASE("LR schedulers: option validation names the scheduler and the option") {
  TwoGroups m;
  check_error([&] { ExponentialLR(m.opt, {}); }, {"ExponentialLR", "gamma must be positive", "got 0"});
  check_error([&] { MultiStepLR(m.opt, {.milestones = {3, -1}}); }, {"MultiStepLR", "milestones", "-1"});
  check_error([&] { CosineAnnealingWarmRestarts(m.opt, {.T_0 = 0}); }, {"CosineAnnealingWarmRestarts", "T_0", "got 0"});
  check_error([&] { CosineAnnealingWarmRestarts(m.opt, {.T_0 = 2, .T_mult = 0}); },
              {"CosineAnnealingWarmRestarts", "T_mult must be >= 1"});
  check_error(
      [&] {
        OneCycleLR(m.opt, {.max_lr = {0.1, 0.2, 0.3}, .total_steps = 10});
      },
      {"OneCycleLR", "max_lr has 3 values", "2 param groups"});
  check_error([&] { OneCycleLR(m.opt, {.max_lr = {}, .total_steps = 10}); }, {"OneCycleLR", "max_lr has 0 values"});
  check_error([&] { OneCycleLR(m.opt, {.max_lr = {-0.1}, .total_steps = 10}); },
              {"OneCycleLR", "max_lr must be positive"});
  check_error([&] { OneCycleLR(m.opt, {.max_lr = {0.1}, .total_steps = 0}); }, {"OneCycleLR", "total_steps", "got 0"});
  check_error([&] { OneCycleLR(m.opt, {.max_lr = {0.1}, .total_steps = 10, .pct_start = 1.5}); },
              {"OneCycleLR", "pct_start", "1.5"});
  check_error([&] { OneCycleLR(m.opt, {.max_lr = {0.1}, .total_steps = 10, .div_factor = 0}); },
              {"OneCycleLR", "div_factor"});
  check_error([&] { OneCycleLR(m.opt, {.max_lr = {0.1}, .total_steps = 10, .final_div_factor = -1}); },
              {"OneCycleLR", "final_div_factor"});
  // pct_start * total_steps == 1: an empty first phase, where PyTorch divides by zero
  check_error([&] { OneCycleLR(m.opt, {.max_lr = {0.1}, .total_steps = 10, .pct_start = 0.1}); },
              {"OneCycleLR", "no steps"});
  check_error([&] { ReduceLROnPlateau(m.opt, {.factor = 1.0}); }, {"ReduceLROnPlateau", "factor", "[0, 1)"});
  check_error([&] { ReduceLROnPlateau(m.opt, {.patience = -1}); }, {"ReduceLROnPlateau", "patience"});
  check_error([&] { ReduceLROnPlateau(m.opt, {.threshold = -1e-4}); }, {"ReduceLROnPlateau", "threshold"});
  check_error([&] { ReduceLROnPlateau(m.opt, {.cooldown = -2}); }, {"ReduceLROnPlateau", "cooldown"});
  check_error(
      [&] {
        ReduceLROnPlateau(m.opt, {.min_lr = {0.1, 0.2, 0.3}});
      },
      {"ReduceLROnPlateau", "min_lr has 3 values", "2 param groups"});
  check_error([&] { ReduceLROnPlateau(m.opt, {.min_lr = {-1.0}}); },
              {"ReduceLROnPlateau", "min_lr must be non-negative"});
  check_error([&] { ReduceLROnPlateau(m.opt, {.eps = -1}); }, {"ReduceLROnPlateau", "eps"});
}

// Note [Loading a schedule leaves a loaded lr]: a resumed chain gives the uninterrupted lrs
// whatever the order of the loads, when the optimizer's state dict (which holds the chain's
// lr) is loaded too; frugal once set the last loaded scheduler's closed form, and a resumed
// ExponentialLR x MultiStepLR then ran at 2.2x the lr of the uninterrupted run for good. A
// warmup beside ReduceLROnPlateau likewise keeps the plateau's reductions.
TEST_CASE("LR schedulers: a resumed chain keeps the optimizer's lr, in any order of the loads") {
  const int64_t k = 7;  // past the first milestone
  TwoGroups first;
  ExponentialLR exp(first.opt, {.gamma = 0.9});
  MultiStepLR ms(first.opt, {.milestones = {5, 12}, .gamma = 0.5});
  for (int64_t t = 0; t < k; ++t) {
    exp.step();
    ms.step();
  }
  const StateDict saved_opt = first.opt.state_dict(), saved_exp = exp.state_dict(), saved_ms = ms.state_dict();
  for (int order = 0; order < 3; ++order) {
    CAPTURE(order);
    TwoGroups second;
    ExponentialLR exp2(second.opt, {.gamma = 0.9});
    MultiStepLR ms2(second.opt, {.milestones = {5, 12}, .gamma = 0.5});
    if (order == 0) second.opt.load_state_dict(saved_opt);
    exp2.load_state_dict(saved_exp);
    if (order == 1) second.opt.load_state_dict(saved_opt);
    ms2.load_state_dict(saved_ms);
    if (order == 2) second.opt.load_state_dict(saved_opt);
    if (order == 0)  // loaded after the optimizer: last_lr() reports the lr in effect
      CHECK(exp2.last_lr() == std::vector<double>{second.opt.param_groups()[0].lr, second.opt.param_groups()[1].lr});
    check_run(
        second.opt, chained_exp_multistep,
        [&](int64_t) {
          exp2.step();
          ms2.step();
        },
        k);
  }

  // LinearLR warmup stepped with ReduceLROnPlateau: resumed at epoch 12 (after two
  // reductions) equals the uninterrupted run over 25 epochs.
  const ReduceLROnPlateauOptions plateau{.factor = 0.5, .patience = 1, .threshold = 0.1};
  auto run = [&](TwoGroups& m, LinearLR& warm, ReduceLROnPlateau& plat, int64_t from, int64_t to) {
    std::vector<double> lrs;
    for (int64_t t = from; t < to; ++t) {
      warm.step();
      plat.step(t < 3 ? 1.0 - 0.2 * double(t) : 1.0);  // improves, then stalls
      lrs.push_back(m.opt.param_groups()[1].lr);
    }
    return lrs;
  };
  TwoGroups a;
  LinearLR warm_a(a.opt, {.start_factor = 0.25, .total_iters = 10});
  ReduceLROnPlateau plat_a(a.opt, plateau);
  const std::vector<double> head = run(a, warm_a, plat_a, 0, 12);
  const StateDict opt_state = a.opt.state_dict(), warm_state = warm_a.state_dict(), plat_state = plat_a.state_dict();
  const std::vector<double> tail = run(a, warm_a, plat_a, 12, 25);
  TwoGroups b;
  LinearLR warm_b(b.opt, {.start_factor = 0.25, .total_iters = 10});
  ReduceLROnPlateau plat_b(b.opt, plateau);
  b.opt.load_state_dict(opt_state);
  plat_b.load_state_dict(plat_state);
  warm_b.load_state_dict(warm_state);
  CHECK(b.opt.param_groups()[1].lr == head.back());
  CHECK(run(b, warm_b, plat_b, 12, 25) == tail);
  CHECK(head.back() < 0.5 * 0.5);  // the plateau did reduce before the save
}

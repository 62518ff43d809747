"""Config and search-space expansion (no kernel needed)."""
import copy
import json
import pickle

import pytest
from mgjit.autotune import Config, expand_space


def test_config_equality_ignores_argument_order_and_keys_are_canonical():
    a = Config(BM=128, BN=256, num_warpgroups=3)
    b = Config(BN=256, BM=128, num_warpgroups=3)
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    assert a.key() == '{"cluster":null,"kwargs":{"BM":128,"BN":256},"num_warpgroups":3}'
    assert a != Config(BM=128, BN=256, num_warpgroups=2)
    assert a != Config(BM=128, BN=256)  # None: the kernel's own default, which may not be 3
    assert a != Config(BM=128, BN=256, num_warpgroups=3, cluster=(2, 1, 1))
    assert a == Config(BM=128, BN=256, num_warpgroups=3, cluster=(1, 1, 1))
    assert a == Config(BN=256, BM=128, num_warpgroups=3, cluster=1)
    assert len({a, b, Config(BM=64, BN=256, num_warpgroups=3)}) == 2


def test_config_repr_keeps_the_given_order_and_omits_defaults():
    assert repr(Config(BM=128, BK=64, SWIZZLE=128)) == "Config(BM=128, BK=64, SWIZZLE=128)"
    assert repr(Config(BM=64, num_warpgroups=2, cluster=2)) == "Config(BM=64, num_warpgroups=2, cluster=(2, 1, 1))"
    assert Config(BM=64, cluster=(2, 1)).short() == "BM=64 cl=2x1x1"
    assert Config(BM=64, num_warpgroups=2).short() == "BM=64 wg=2"


def test_launch_options_are_passed_only_when_set():
    assert Config(BM=64).launch_kwargs() == {"BM": 64}
    assert Config(BM=64, num_warpgroups=2, cluster=(1, 2)).launch_kwargs() == {"BM": 64, "num_warpgroups": 2,
                                                                               "cluster": (1, 2, 1)}


def test_config_json_and_pickle_round_trip():
    config = Config(BM=128, BN=256, BK=64, STAGES=4, SWIZZLE=128, num_warpgroups=3, cluster=(2, 1, 1),
                    ORDER=(1, 0), NAME="x", EPS=0.5, FLAG=True)
    data = json.loads(json.dumps(config.to_json()))
    assert Config.from_json(data) == config
    assert pickle.loads(pickle.dumps(config)) == config
    assert copy.deepcopy(config) == config
    assert config.launch_kwargs() == {"BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "SWIZZLE": 128,
                                      "ORDER": (1, 0), "NAME": "x", "EPS": 0.5, "FLAG": True,
                                      "num_warpgroups": 3, "cluster": (2, 1, 1)}


def test_replace_sets_constexprs_and_launch_options_and_keeps_the_rest():
    c = Config(BM=128, BN=256, num_warpgroups=2, cluster=(2, 1, 1))
    assert c.replace(BN=64, STAGES=3) == Config(BM=128, BN=64, STAGES=3, num_warpgroups=2, cluster=(2, 1, 1))
    assert c.replace(num_warpgroups=None, cluster=(4, 1, 1)) == Config(BM=128, BN=256, cluster=(4, 1, 1))
    assert c == Config(BM=128, BN=256, num_warpgroups=2, cluster=(2, 1, 1))  # unchanged itself
    with pytest.raises(ValueError, match="num_warpgroups"):
        c.replace(num_warpgroups=0)


def test_config_is_immutable():
    config = Config(BM=128)
    with pytest.raises(AttributeError, match="immutable"):
        config.num_warpgroups = 2
    with pytest.raises(TypeError):
        config.kwargs["BM"] = 64
    assert config.kwargs["BM"] == 128


@pytest.mark.parametrize("kwargs, message", [
    (dict(BM=[1, [2]]), "must be a bool, int, float, str, None or a tuple"),
    (dict(BM=object()), "must be a bool, int, float, str, None or a tuple"),
    (dict(num_warpgroups=0), "num_warpgroups must be a positive int or None; got 0"),
    (dict(num_warpgroups=True), "num_warpgroups must be a positive int or None; got True"),
    (dict(cluster=(1, 1, 1, 1)), r"cluster must be 1 to 3 positive ints.*got \(1, 1, 1, 1\)"),
    (dict(cluster=(0, 1)), r"cluster must be 1 to 3 positive ints"),
])
def test_config_rejects_bad_values_saying_what_was_expected(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        Config(**kwargs)


def test_from_json_rejects_other_shapes():
    with pytest.raises(ValueError, match="expected a config's JSON form"):
        Config.from_json({"BM": 128})


def test_space_expands_to_the_cartesian_product_in_order_with_launch_options():
    configs = expand_space(dict(BM=[64, 128], BN=[128, 256], num_warpgroups=[1, 2]))
    assert len(configs) == 8
    assert configs[0] == Config(BM=64, BN=128, num_warpgroups=1)
    assert configs[1] == Config(BM=64, BN=128, num_warpgroups=2)
    assert configs[-1] == Config(BM=128, BN=256, num_warpgroups=2)
    assert len(set(configs)) == 8


def test_space_filter_and_errors():
    configs = expand_space(dict(BM=[64, 128, 256], BN=[64, 128]), lambda c: c.kwargs["BM"] >= c.kwargs["BN"])
    assert [(c.kwargs["BM"], c.kwargs["BN"]) for c in configs] == [(64, 64), (128, 64), (128, 128),
                                                                    (256, 64), (256, 128)]
    with pytest.raises(ValueError, match="removed every config"):
        expand_space(dict(BM=[64]), lambda c: False)
    with pytest.raises(ValueError, match=r"space\['BN'\] is empty"):
        expand_space(dict(BM=[64], BN=[]))
    with pytest.raises(TypeError, match=r"space\['BM'\] must be a list"):
        expand_space(dict(BM=64))

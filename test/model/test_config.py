# Proves ModelConfig is defined once and behaves: JSON round-trips exactly,
# --set overrides parse by field type, and invalid values are rejected with a
# message naming the field.
import pytest

import model


@pytest.mark.parametrize("name", list(model.CONFIGS))
def test_config_json_round_trips_exactly(name):
    cfg = model.get_config(name)
    assert model.ModelConfig.from_json(cfg.to_json()) == cfg


def test_overrides_parse_by_field_type():
    cfg = model.apply_overrides(model.get_config("n16-tiny"),
                                ["use_imu=true", "imu_tokens=6", "noise_s=0.99", "tune_visual=0"])
    assert cfg.use_imu is True and cfg.imu_tokens == 6 and cfg.noise_s == 0.99 and cfg.tune_visual is False


@pytest.mark.parametrize("override,field", [
    (["vit_heads=5"], "vit_width"),
    (["tune_top_llm_layers=3"], "tune_top_llm_layers"),
    (["action_horizon=65"], "action_horizon"),
    (["use_imu=maybe"], "use_imu"),
    (["nonsense=1"], "nonsense"),
])
def test_invalid_overrides_are_rejected_naming_the_field(override, field):
    with pytest.raises(ValueError, match=field):
        model.apply_overrides(model.get_config("n16-tiny"), override)


def test_unknown_config_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="n16-tiny"):
        model.get_config("n16-7b")

from support.models import FACTORIES

from specrt.export.graph.architectures import supported_model_types


def test_every_registered_architecture_has_a_test_model():
    assert sorted(FACTORIES) == supported_model_types()

"""Which adapter serves which action. An action no adapter serves is refused at prepare."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from opledger.ledger import ClaimTerms, UnknownAction
from opledger.ledger.approval_policy import NEVER, Policy, parse_policy, policies_setting
from opledger.ledger.contract import Contract, Limits
from opledger.ledger.ids import LONGEST_KEY, check_action
from opledger.ledger.intents import RUN, check_fields, check_scope, parse_scopes
from opledger.ledger.payload_schemas import check_schema
from opledger.settings import Settings, SettingsInvalid

from .base import Adapter, extra

#: the payload schema of an action whose adapter declares none
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class Registry:
    """Maps versioned actions (and their prefixes) to configured adapters.

    It is the ledger's `ActionResolver`: `Ledger(engine, actions=registry)`.
    """

    def __init__(self, adapters: Iterable[Adapter] = ()) -> None:
        self._by_action: dict[str, Adapter] = {}
        self._terms: dict[timedelta, ClaimTerms] = {}
        self._intent_fields: dict[str, tuple[str, ...]] = {}
        self._intent_scopes: dict[str, str] = {}
        #: the deployment's own scopes (`scope`), over what the adapters declare
        self._scoped: dict[str, str] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        self._policies: dict[str, Policy] = {}
        #: the deployment's own approval policies (`require_approval`), over the adapters'
        self._approvals: dict[str, Policy] = {}
        self._descriptions: dict[str, str] = {}
        self._limits: dict[str, Limits] = {}
        for adapter in adapters:
            self.register(adapter)

    def register(self, adapter: Adapter) -> None:
        """Serve the adapter's actions. Refused: an action already served by another, and a
        provider that would refuse opledger's keys (`max_key_length`), so no operation is
        prepared that could never be sent."""
        idem = adapter.contract.idempotency
        limit = idem.max_key_length
        if idem.kind == "keyed" and limit is not None and limit < LONGEST_KEY:
            raise ValueError(
                f"{adapter.contract.provider} accepts keys of at most {limit} characters; "
                f"opledger's keys take up to {LONGEST_KEY}"
            )
        declared = dict(extra(adapter, "intent_fields") or {})
        scopes = dict(extra(adapter, "intent_scopes") or {})
        schemas = dict(extra(adapter, "payload_schemas") or {})
        descriptions = dict(extra(adapter, "descriptions") or {})
        approvals = dict(extra(adapter, "approval_policies") or {})
        for member, named in (
            ("intent_fields", declared),
            ("intent_scopes", scopes),
            ("payload_schemas", schemas),
            ("approval_policies", approvals),
            ("descriptions", descriptions),
        ):
            unserved = sorted(set(named) - set(adapter.actions))
            if unserved:
                raise ValueError(
                    f"{member} names actions the adapter does not serve: {', '.join(unserved)}"
                )
        for action, schema in schemas.items():
            if not isinstance(schema, Mapping):
                raise ValueError(f"the payload schema of {action} must be a JSON Schema object")
            check_schema(action, schema)
        # a malformed policy is refused here, naming its action (ApprovalPolicyInvalid)
        policies = {action: parse_policy(action, raw) for action, raw in approvals.items()}
        for action in adapter.actions:
            check_action(action)
            if action in self._by_action and self._by_action[action] is not adapter:
                raise ValueError(f"{action} is already served by another adapter")
            self._by_action[action] = adapter
            self._intent_fields[action] = check_fields(declared.get(action, ()))
            self._intent_scopes[action] = check_scope(scopes.get(action, RUN))
            self._schemas[action] = dict(schemas.get(action, ANY_OBJECT))
            self._policies[action] = policies.get(action, NEVER)
            self._descriptions[action] = str(descriptions.get(action, "")) or (
                f"{action} ({adapter.contract.effect}, at {adapter.contract.provider})"
            )
        self._terms.clear()

    def adapter_for(self, action: str) -> Adapter:
        check_action(action)
        try:
            return self._by_action[action]
        except KeyError:
            raise UnknownAction(
                f"no adapter serves {action!r} (known: {', '.join(sorted(self._by_action))}); "
                "serve it by adding its adapter to the registry OPLEDGER_ADAPTERS names, in "
                "every process (docs/adapters.md)",
                action=action,
            ) from None

    def intent_fields(self, action: str) -> tuple[str, ...]:
        """The payload fields that make another act of `action` (its adapter's
        `intent_fields`; none declared: the action and the target alone)."""
        self.adapter_for(action)
        return self._intent_fields[action]

    def intent_scope(self, action: str) -> str:
        """How wide one act of `action` is: "run" or "tenant" (the deployment's `scope`,
        else its adapter's `intent_scopes`, else "run": one act per run)."""
        self.adapter_for(action)
        return self._scoped.get(action, self._intent_scopes[action])

    def scope(self, action: str, scope: str) -> None:
        """Make `action` an act of `scope` ("run" or "tenant") whatever its adapter
        declares: a deployment's own choice (`OPLEDGER_INTENT_SCOPES`, which
        `load_registry` applies). Every process must say the same, or one act gets two
        keys."""
        self.adapter_for(action)
        self._scoped[action] = check_scope(scope)

    def payload_schema(self, action: str) -> dict[str, Any]:
        """The JSON Schema of `action`'s payload (its adapter's `payload_schemas`; none
        declared: any JSON object)."""
        self.adapter_for(action)
        return dict(self._schemas[action])

    def approval_policy(self, action: str) -> Policy:
        """Which acts of `action` a person approves before anything is sent (the
        deployment's `require_approval`, else its adapter's `approval_policies`, else
        never): read by the ledger when it records an act (`opledger.ledger.approval_policy`)."""
        self.adapter_for(action)
        return self._approvals.get(action, self._policies[action])

    def require_approval(self, action: str, policy: Any) -> None:
        """Make `policy` (as `approval_policies` spells one) `action`'s whatever its adapter
        declares: a deployment's own choice (`OPLEDGER_APPROVAL_POLICIES`, which
        `load_registry` applies). Refused when malformed (`ApprovalPolicyInvalid`)."""
        self.adapter_for(action)
        self._approvals[action] = parse_policy(action, policy)

    def description(self, action: str) -> str:
        """What `action` does, for an agent (its adapter's `descriptions`, or its effect)."""
        self.adapter_for(action)
        return self._descriptions[action]

    def contract_for(self, action: str) -> Contract:
        return self.adapter_for(action).contract

    def provider_for(self, action: str) -> str:
        return self.adapter_for(action).contract.provider

    def claim_terms(self, lease: timedelta) -> ClaimTerms:
        """The claim terms for this registry's providers under `lease`, built once."""
        terms = self._terms.get(lease)
        if terms is None:
            terms = self._terms[lease] = ClaimTerms(
                lease=lease,
                in_flight_by_provider=self.in_flight_by_provider(),
                send_window_by_provider=self.send_window_by_provider(),
                limits_by_provider=self.limits_by_provider(),
            )
        return terms

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(sorted({a.contract.provider for a in self._by_action.values()}))

    def limit(self, provider: str, limits: Limits) -> None:
        """Enforce `limits` for `provider` instead of what its adapters' contracts declare:
        a deployment's own numbers (`OPLEDGER_PROVIDER_LIMITS`, which `load_registry`
        applies). The decision still reads the contract's own facts."""
        if provider not in self.providers:
            raise ValueError(
                f"no adapter serves provider {provider!r} (providers: "
                f"{', '.join(self.providers) or 'none'})"
            )
        self._limits[provider] = limits
        self._terms.clear()

    def limits_for(self, provider: str) -> Limits:
        """The limits enforced for `provider`: the deployment's (`limit`), else those its
        adapters' contracts declare (the first adapter's breaker settings)."""
        if provider in self._limits:
            return self._limits[provider]
        for adapter in self._by_action.values():
            if adapter.contract.provider == provider:
                return adapter.contract.limits
        return Limits()

    def limits_by_provider(self) -> dict[str, dict[str, float | int]]:
        """Each limited provider's limits, in the claim statement's form. Where two
        adapters of one provider declare different limits, the tighter of each wins; a
        deployment's own (`limit`) replace them."""
        result: dict[str, dict[str, float | int]] = {}
        for adapter in self._by_action.values():
            c = adapter.contract
            if c.provider in self._limits:
                continue
            form = c.limits.claim_form()
            if not form:
                continue
            merged = result.setdefault(c.provider, {})
            for name, value in form.items():
                if name == "interval_s":
                    merged[name] = max(merged.get(name, value), value)
                else:
                    merged[name] = min(merged.get(name, value), value)
        for provider, limits in self._limits.items():
            if limits.claim_form():
                result[provider] = limits.claim_form()
        return result

    def in_flight_by_provider(self) -> dict[str, timedelta]:
        """Each provider's longest in-flight time, for the claim's attempt deadline."""
        result: dict[str, timedelta] = {}
        for adapter in self._by_action.values():
            c = adapter.contract
            result[c.provider] = max(result.get(c.provider, c.max_in_flight), c.max_in_flight)
        return result

    def send_window_by_provider(self) -> dict[str, timedelta]:
        """Each provider's send-by window: how long after its claim a worker may still
        start a request. It is the contract's request timeout — at least the time a
        connection may take to set up (the check comes after it), so a normal claim never
        misses it — and the attempt's in-flight deadline grows by as much."""
        result: dict[str, timedelta] = {}
        for adapter in self._by_action.values():
            c = adapter.contract
            result[c.provider] = min(result.get(c.provider, c.request_timeout), c.request_timeout)
        return result

    def close(self) -> None:
        """Close every adapter that holds connections."""
        for adapter in {id(a): a for a in self._by_action.values()}.values():
            close = extra(adapter, "close")
            if callable(close):
                close()

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(sorted(self._by_action))


class AdaptersInvalid(SettingsInvalid, ValueError):
    """`OPLEDGER_ADAPTERS` names no usable registry factory. The message is one line that
    names the setting, its value and what is wrong with it.

    A `SettingsInvalid` (so a `NotConfigured`): the `opledger` command prints it like any
    other setting error, exit code 4, no traceback. Also a `ValueError`, so a caller that
    catches a registry's refusals (an inconsistent contract) catches this too."""


#: a dotted Python name: a module path, or the function's name inside the module
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_FORM = "the form is module:function, e.g. myapp.adapters:build_registry"


def load_registry(settings: Settings) -> Registry:
    """Build the adapter registry named by `OPLEDGER_ADAPTERS` ('module:function'): import
    the module, call the function with `settings`, and return the `Registry` it built.

    Every mistake in the setting raises `AdaptersInvalid` with one line saying which: no
    ':function' part (there is no default name to fall back to), a module that cannot be
    imported, a missing attribute, a class or anything else that is not a function, a
    function that does not take the settings, a function that raises, and one that returns
    something other than a `Registry`. The original exception is chained (`--debug`).
    """
    spec = settings.adapters
    where = f"OPLEDGER_ADAPTERS={spec!r}"
    module_name, colon, function = spec.partition(":")
    if not colon:
        raise AdaptersInvalid(f"{where} names no function: {_FORM}")
    if not _DOTTED.fullmatch(module_name):
        raise AdaptersInvalid(f"{where}: {module_name!r} is not a module name: {_FORM}")
    if not _DOTTED.fullmatch(function):
        raise AdaptersInvalid(f"{where}: {function!r} is not a function name: {_FORM}")
    module = _import(where, module_name)
    factory: Any = module
    for part in function.split("."):
        try:
            factory = getattr(factory, part)
        except AttributeError:
            raise AdaptersInvalid(f"{where}: {module_name} defines no {function!r}") from None
    named = f"{module_name}.{function}"
    if inspect.isclass(factory):
        raise AdaptersInvalid(
            f"{where}: {named} is a class; name a function that takes the settings and "
            "returns a Registry"
        )
    if not callable(factory):
        raise AdaptersInvalid(
            f"{where}: {named} is a {type(factory).__name__}, not a function that takes the "
            "settings and returns a Registry"
        )
    try:
        inspect.signature(factory).bind(settings)
    except TypeError:
        raise AdaptersInvalid(
            f"{where}: {named}{inspect.signature(factory)} does not take one argument, the settings"
        ) from None
    except ValueError:  # no signature to read (a builtin): calling it will tell
        pass
    try:
        registry = factory(settings)
    except Exception as exc:
        raise AdaptersInvalid(f"{where}: {named} raised {_first_line(exc)}") from exc
    if not isinstance(registry, Registry):
        raise AdaptersInvalid(
            f"{where}: {named} returned {type(registry).__name__}, not a Registry "
            "(opledger.adapters.registry.Registry)"
        )
    _apply_limits(registry, settings, where)
    _apply_scopes(registry, settings, where)
    _apply_approval_policies(registry, settings, where)
    return registry


def _apply_limits(registry: Registry, settings: Settings, where: str) -> None:
    """The deployment's own limits (`OPLEDGER_PROVIDER_LIMITS`) over the contracts'; a
    provider name no adapter serves is refused (a typo would otherwise limit nothing)."""
    for provider, given in settings.provider_limits.items():
        if provider not in registry.providers:
            raise SettingsInvalid(
                f"OPLEDGER_PROVIDER_LIMITS names provider {provider!r}, which no adapter of "
                f"{where} serves (its providers: {', '.join(registry.providers) or 'none'})"
            )
        registry.limit(provider, given.apply(registry.limits_for(provider)))


def _apply_scopes(registry: Registry, settings: Settings, where: str) -> None:
    """The deployment's own intent scopes (`OPLEDGER_INTENT_SCOPES`) over the adapters'; an
    action no adapter serves is refused (a typo would otherwise widen nothing)."""
    for action, scope in parse_scopes(settings.intent_scopes or "").items():
        if action not in registry.actions:
            raise SettingsInvalid(
                f"OPLEDGER_INTENT_SCOPES names action {action!r}, which no adapter of {where} "
                f"serves (its actions: {', '.join(registry.actions) or 'none'})"
            )
        registry.scope(action, scope)


def _apply_approval_policies(registry: Registry, settings: Settings, where: str) -> None:
    """The deployment's own approval policies (`OPLEDGER_APPROVAL_POLICIES`) over the
    adapters'; an action no adapter serves is refused (a typo would otherwise ask nobody)."""
    for action, policy in policies_setting(settings.approval_policies or "").items():
        if action not in registry.actions:
            raise SettingsInvalid(
                f"OPLEDGER_APPROVAL_POLICIES names action {action!r}, which no adapter of "
                f"{where} serves (its actions: {', '.join(registry.actions) or 'none'})"
            )
        registry.require_approval(action, policy)


def _import(where: str, module_name: str) -> ModuleType:
    """The module, or `AdaptersInvalid` saying why it cannot be imported in this process."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(f"{missing}."):
            # the module itself (or its package) is not on this process's path: the usual
            # cause is a process started elsewhere, or without the application installed
            raise AdaptersInvalid(
                f"{where}: cannot import {module_name}: {_first_line(exc, typed=False)} (is "
                "it installed, or on PYTHONPATH, in this process?)"
            ) from exc
        raise AdaptersInvalid(
            f"{where}: importing {module_name} failed: {_first_line(exc)}"
        ) from exc
    except Exception as exc:  # a syntax error, a failing import-time statement
        raise AdaptersInvalid(
            f"{where}: importing {module_name} failed: {_first_line(exc)}"
        ) from exc


def _first_line(exc: BaseException, *, typed: bool = True) -> str:
    """The exception as one line: its type and its message's first line (a validation
    error's first message)."""
    if isinstance(exc, ValidationError):
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
    else:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        message = lines[0] if lines else ""
    message = message[:300]
    if not typed:
        return message or type(exc).__name__
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
